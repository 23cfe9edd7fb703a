package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/catalog"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// sampleObjects decodes every document of every examples/*/*.yaml strictly
// (an unknown or misspelled field fails) into the repository's API types.
func sampleObjects() map[string][]client.Object {
	files, err := filepath.Glob(filepath.Join(paths.RepoRoot(), "examples", "*", "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	Expect(files).NotTo(BeEmpty())
	out := map[string][]client.Object{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			Expect(err).NotTo(HaveOccurred(), f)
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			u := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal(doc, &u.Object)).To(Succeed(), f)
			var obj client.Object
			switch u.GetKind() {
			case "Workflow":
				obj = &v1alpha1.Workflow{}
			case "Bucket":
				obj = &v1alpha1.Bucket{}
			case "Trigger":
				obj = &v1alpha1.Trigger{}
			default:
				Fail(fmt.Sprintf("%s: unexpected kind %q", f, u.GetKind()))
			}
			Expect(yaml.UnmarshalStrict(doc, obj)).To(Succeed(), f)
			rel, _ := filepath.Rel(paths.RepoRoot(), f)
			out[rel] = append(out[rel], obj)
		}
	}
	return out
}

// loadSample reads examples/<name>/workflow.yaml for a run in namespace ns.
// It is applied as written: the local cluster runs each function's image as
// the image catalog (config/local/images.yaml) says, in the sample's
// directory, building a Go sample's package once.
func loadSample(name, ns string) *v1alpha1.Workflow {
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "examples", name, "workflow.yaml"))
	Expect(err).NotTo(HaveOccurred())
	wf := &v1alpha1.Workflow{}
	Expect(yaml.UnmarshalStrict(data, wf)).To(Succeed())
	wf.Namespace = ns
	return wf
}

// imageCatalog is the catalog the local cluster runs images from.
func imageCatalog() *catalog.Catalog {
	c, err := catalog.Load(filepath.Join(paths.RepoRoot(), "config", "local", "images.yaml"), GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	return c
}

// runSample deploys a sample and runs one session per input file.
func runSample(name string, inputs ...string) []string {
	wf := loadSample(name, newNamespace())
	Expect(k8s.Create(ctx, wf)).To(Succeed())
	waitWorkflowReady(wf)
	var results []string
	for _, in := range inputs {
		data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "examples", name, in))
		Expect(err).NotTo(HaveOccurred())
		result, s := runSession(wf.Namespace, wf.Name, string(data))
		Expect(s.State).To(Equal(sessions.Completed))
		results = append(results, result)
	}
	return results
}

func sampleInput(name, file string) []byte {
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "examples", name, file))
	Expect(err).NotTo(HaveOccurred())
	return data
}

var _ = Describe("the samples under examples/", func() {
	It("decode strictly into the API types and are accepted by the API server", func() {
		samples := sampleObjects()
		Expect(len(samples)).To(BeNumerically(">=", 7))
		root := paths.RepoRoot()
		images := imageCatalog()
		for file, objs := range samples {
			ns := newNamespace()
			for _, obj := range objs {
				obj.SetNamespace(ns)
				Expect(k8s.Create(ctx, obj, client.DryRunAll)).To(Succeed(), "%s: %s", file, obj.GetName())
				wf, ok := obj.(*v1alpha1.Workflow)
				if !ok {
					continue
				}
				// What the local cluster runs must exist: the image is in
				// the catalog, its program is there, and the function's
				// argument is one of the program's roles.
				for _, fn := range wf.Spec.Functions {
					img, err := images.Lookup(fn.Image)
					Expect(err).NotTo(HaveOccurred(), "%s: function %s", file, fn.Name)
					Expect(fn.Command).To(BeEmpty(), "%s: function %s runs its image's entrypoint", file, fn.Name)
					Expect(fn.Args).To(HaveLen(1), "%s: function %s: args: [ROLE]", file, fn.Name)
					dir := filepath.Join(images.Root, img.WorkingDir)
					Expect(dir).To(BeADirectory(), "%s: function %s", file, fn.Name)
					var program string
					if img.GoPackage != "" {
						program = filepath.Join(images.Root, img.GoPackage, "main.go")
					} else {
						Expect(img.Entrypoint).To(HaveLen(2), "%s: image %s: [python3, PROGRAM]", file, fn.Image)
						program = filepath.Join(dir, img.Entrypoint[1])
					}
					Expect(program).To(BeARegularFile(), "%s: function %s", file, fn.Name)
					src, err := os.ReadFile(program)
					Expect(err).NotTo(HaveOccurred())
					Expect(string(src)).To(ContainSubstring(strconv.Quote(fn.Args[0])), "%s: function %s: %s has no role %q", file, fn.Name, program, fn.Args[0])
				}
			}
			Expect(filepath.Join(root, filepath.Dir(file), "README.md")).To(BeARegularFile())
		}
	})

	It("adevents: Immediate enrichment, then a ByTime window per campaign", func() {
		result := runSample("adevents", "events.jsonl")[0]
		var got struct {
			Events    int `json:"events"`
			Campaigns map[string]struct {
				Impressions int     `json:"impressions"`
				Clicks      int     `json:"clicks"`
				Spend       float64 `json:"spend"`
			} `json:"campaigns"`
		}
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed(), result)
		campaign := map[string]string{"ad-1": "spring-sale", "ad-2": "spring-sale", "ad-3": "new-phone"}
		want := map[string][2]int{}
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(string(sampleInput("adevents", "events.jsonl"))), "\n") {
			var e struct{ Ad, Type string }
			Expect(json.Unmarshal([]byte(line), &e)).To(Succeed())
			c := want[campaign[e.Ad]]
			if e.Type == "click" {
				c[1]++
			} else {
				c[0]++
			}
			want[campaign[e.Ad]] = c
			n++
		}
		Expect(got.Events).To(Equal(n), "every event lands in the one window")
		Expect(got.Campaigns).To(HaveLen(len(want)))
		for name, c := range want {
			Expect([2]int{got.Campaigns[name].Impressions, got.Campaigns[name].Clicks}).To(Equal(c), name)
		}
	})

	It("stragglers: Redundant votes on the first three of five answers", func() {
		wf := loadSample("stragglers", newNamespace())
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		input := sampleInput("stragglers", "request.txt")
		result, s := runSession(wf.Namespace, wf.Name, string(input))
		Expect(s.State).To(Equal(sessions.Completed))
		var got struct {
			Answer   string   `json:"answer"`
			Votes    int      `json:"votes"`
			Answered []string `json:"answered"`
		}
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed(), result)
		sum := sha256.Sum256(input)
		Expect(got.Answer).To(Equal(hex.EncodeToString(sum[:])))
		Expect(got.Votes).To(Equal(3))
		Expect(got.Answered).To(HaveLen(3))
		Expect(got.Answered).NotTo(ContainElement("replica-4"), "the straggler is not waited for")
		Expect(s.Ended.Sub(s.Started)).To(BeNumerically("<", 5*time.Second), "faster than the straggler")
	})

	It("fanin: BySet confirms once all three checks are in", func() {
		var got struct {
			Approved bool                       `json:"approved"`
			Checks   map[string]json.RawMessage `json:"checks"`
		}
		result := runSample("fanin", "order.json")[0]
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed(), result)
		Expect(got.Approved).To(BeTrue())
		Expect(got.Checks).To(HaveKey("payment"))
		Expect(got.Checks).To(HaveKey("stock"))
		Expect(got.Checks).To(HaveKey("shipping"))
	})

	It("dynamicmap: DynamicJoin waits for as many results as the input has lines", func() {
		Expect(runSample("dynamicmap", "numbers.txt")[0]).To(MatchJSON(
			`{"10": 4, "100": 25, "1000": 168, "10000": 1229, "100000": 9592, "1000000": 78498}`))
	})

	It("conditional: ByName runs exactly the branch the classifier chose", func() {
		results := runSample("conditional", "small.json", "large.json")
		Expect(results[0]).To(MatchJSON(`{"id": "p-1001", "decision": "approved"}`))
		Expect(results[1]).To(MatchJSON(`{"id": "p-1002", "decision": "manual review", "reasons": ["amount above 500"]}`))
	})

	It("batched: ByBatchSize summarizes every four readings", func() {
		result := runSample("batched", "readings.csv")[0]
		var got struct {
			Batches   int `json:"batches"`
			Summaries []struct {
				Count int     `json:"count"`
				Min   float64 `json:"min"`
				Max   float64 `json:"max"`
				Mean  float64 `json:"mean"`
			} `json:"summaries"`
		}
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed(), result)
		var values []float64
		for _, line := range strings.Split(string(sampleInput("batched", "readings.csv")), "\n") {
			if _, v, ok := strings.Cut(line, ","); ok && !strings.HasPrefix(line, "#") {
				x, err := strconv.ParseFloat(v, 64)
				Expect(err).NotTo(HaveOccurred())
				values = append(values, x)
			}
		}
		Expect(got.Batches).To(Equal(len(values) / 4))
		for i, s := range got.Summaries {
			batch := values[i*4 : i*4+4]
			sum := 0.0
			for _, x := range batch {
				sum += x
			}
			Expect(s.Count).To(Equal(4))
			Expect(s.Min).To(Equal(slices.Min(batch)))
			Expect(s.Max).To(Equal(slices.Max(batch)))
			Expect(s.Mean).To(BeNumerically("~", sum/4, 1e-9))
		}
	})
})
