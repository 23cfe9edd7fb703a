package model

import (
	"errors"
	"math"
)

// Prices are what the resources cost, in US dollars. Memory quantities are
// binary gigabytes (GiB), as the providers bill them (a Lambda "GB" is 1024
// MB). They are configuration: set them to the installation's own prices
// (a cluster's amortized node cost per GiB-second, say); the defaults are
// AWS us-east-1 list prices.
type Prices struct {
	// WorkerPerGiBSecond is the price of one GiB of worker memory for one
	// second. Default $0.0000166667: AWS Lambda, x86, first tier, us-east-1
	// (aws.amazon.com/lambda/pricing, as listed 2024–2025).
	WorkerPerGiBSecond float64 `json:"workerPerGiBSecond"`
	// SlowPerGet and SlowPerPut are the prices of one request to the slow
	// store. Defaults $0.0004 and $0.005 per 1,000: S3 Standard GET and
	// PUT, us-east-1 (aws.amazon.com/s3/pricing, as listed 2024–2025; the
	// PUT price is also Locus Table 2's of Feb 2019).
	SlowPerGet float64 `json:"slowPerGet"`
	SlowPerPut float64 `json:"slowPerPut"`
	// SlowPerGiBMonth is the slow store's storage price. Default $0.023:
	// S3 Standard, first 50 TB, us-east-1 (aws.amazon.com/s3/pricing, as
	// listed 2024–2025; also Locus Table 2, Feb 2019). A month is 730 h.
	SlowPerGiBMonth float64 `json:"slowPerGiBMonth"`
	// FastPerGiBHour is the price of one GiB held in the fast store for an
	// hour. Default $0.125: ElastiCache Serverless for Redis OSS, us-east-1
	// (AWS Database Blog, "Unlock on-demand, cost-optimized performance
	// with Amazon ElastiCache Serverless", Nov 2023; aws.amazon.com/
	// elasticache/pricing). For a node-based cluster set it to 0 and set
	// FastPerNodeHour instead.
	FastPerGiBHour float64 `json:"fastPerGiBHour"`
	// FastPerNodeHour is the price of one fast-store shard (node) for an
	// hour, paid for Params.FastShards nodes. Default 0 (serverless
	// pricing above); e.g. ElastiCache cache.r6g.large (13 GiB) on demand
	// is about $0.206 (aws.amazon.com/elasticache/pricing, 2024).
	FastPerNodeHour float64 `json:"fastPerNodeHour"`
	// FastPerGiBTransferred is the fast store's request price per GiB
	// moved. Default $0.0034 × 1.048576: ElastiCache Serverless bills
	// $0.0034 per million ECPUs, one ECPU per KB transferred (same source).
	FastPerGiBTransferred float64 `json:"fastPerGiBTransferred"`
}

// DefaultPrices are the documented AWS list prices above.
func DefaultPrices() Prices {
	return Prices{
		WorkerPerGiBSecond:    0.0000166667,
		SlowPerGet:            0.0004 / 1000,
		SlowPerPut:            0.005 / 1000,
		SlowPerGiBMonth:       0.023,
		FastPerGiBHour:        0.125,
		FastPerNodeHour:       0,
		FastPerGiBTransferred: 0.0034 * float64(GiB) / 1024 / 1e6,
	}
}

// Validate says what is wrong with p, if anything.
func (p Prices) Validate() error {
	for _, v := range []float64{p.WorkerPerGiBSecond, p.SlowPerGet, p.SlowPerPut, p.SlowPerGiBMonth, p.FastPerGiBHour, p.FastPerNodeHour, p.FastPerGiBTransferred} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return errors.New("prices must be non-negative and finite")
		}
	}
	return nil
}
