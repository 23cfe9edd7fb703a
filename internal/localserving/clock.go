package localserving

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func nowTime() metav1.Time { return metav1.NewTime(time.Now()) }
