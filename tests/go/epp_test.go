// The router's own code over the server's /metrics (issue #21): the Gateway API Inference
// Extension's endpoint-picker scrape (its HTTP metrics data source, which parses with Prometheus'
// strict text parser) and its core metrics extractor, configured for torchtpu-cpp by the Helm
// chart's rendered configuration, run against a real `torchtpu-cpp serve` on the demo checkpoint under load.
// TORCHTPU_CLI names the binary (CTest sets it).
package epp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	extractor "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	source "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/yaml"
)

const context_ = 1024

// chartExtractorParams is the core metrics extractor's configuration for torchtpu-cpp as the Helm
// chart renders it (TORCHTPU_HELM runs `helm template`), after the picker's own loader has read
// the whole plugins file strictly.
func chartExtractorParams(t *testing.T) string {
	t.Helper()
	helm := os.Getenv("TORCHTPU_HELM")
	if helm == "" {
		t.Fatal("set TORCHTPU_HELM to the helm binary (ctest does)")
	}
	out, err := exec.Command(helm, "template", "tt", "../../deploy/helm/torchtpu-cpp",
		"--kube-version", "1.33.0", "--show-only", "templates/epp-config.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var configMap struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(out, &configMap); err != nil {
		t.Fatal(err)
	}
	config, _, err := loader.LoadRawConfig([]byte(configMap.Data["epp-config.yaml"]), logr.Discard())
	if err != nil {
		t.Fatalf("the picker's loader refuses the chart's configuration: %v", err)
	}
	for _, plugin := range config.Plugins {
		if plugin.Type == extractor.MetricsExtractorType {
			return string(plugin.Parameters)
		}
	}
	t.Fatal("the chart's configuration has no core-metrics-extractor")
	return ""
}

type server struct {
	url string
	cmd *exec.Cmd
}

// startServer runs `torchtpu-cpp serve --port 0 ARGS` and waits for /health to answer 200.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	cli := os.Getenv("TORCHTPU_CLI")
	if cli == "" {
		t.Fatal("set TORCHTPU_CLI to the torchtpu-cpp binary (ctest does)")
	}
	cmd := exec.Command(cli, append([]string{"serve", "--port", "0", "--threads", "1"}, args...)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	listening := regexp.MustCompile(`serving \S+ on (http://\S+)`)
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := listening.FindStringSubmatch(lines.Text()); m != nil {
			s.url = m[1]
			break
		}
	}
	if s.url == "" {
		t.Fatal("the server exited before listening")
	}
	go io.Copy(io.Discard, stdout)
	deadline := time.Now().Add(4 * time.Minute)
	for {
		res, err := http.Get(s.url + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the server was not ready in time")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrape is one GET /metrics, without credentials as the endpoint picker sends it, parsed by the
// strict text parser the picker uses; a line it rejects fails the test.
func (s *server) scrape(t *testing.T) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	res, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		t.Fatalf("/metrics answered %d: %s", res.StatusCode, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the strict text parser rejects /metrics: %v\n%s", err, body)
	}
	return string(body), families
}

// awaitRunning scrapes until one request decodes (`what`, named if the deadline passes first).
func (s *server) awaitRunning(t *testing.T, deadline time.Time, what string) {
	t.Helper()
	for {
		_, f := s.scrape(t)
		if gauge(t, f, "torchtpu_running_requests").GetGauge().GetValue() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never ran", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gauge is the single sample of family `name` (which must be a gauge).
func gauge(t *testing.T, families map[string]*dto.MetricFamily, name string) *dto.Metric {
	t.Helper()
	f, ok := families[name]
	if !ok {
		t.Fatalf("/metrics has no %s", name)
	}
	if f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != 1 {
		t.Fatalf("%s: want one gauge sample, got %v with %d samples", name, f.GetType(), len(f.Metric))
	}
	return f.Metric[0]
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// extract runs the upstream core metrics extractor, built from `params` by its factory, over
// `families` for an endpoint with `labels`.
func extract(t *testing.T, params string, labels map[string]string,
	families map[string]*dto.MetricFamily) *fwkdl.Metrics {
	t.Helper()
	plugin, err := extractor.CoreMetricsExtractorFactory("core-metrics-extractor", json.RawMessage(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{Labels: labels}, fwkdl.NewMetrics())
	if err := plugin.(*extractor.Extractor).Extract(context.Background(),
		source.PrometheusMetricMap(families), ep); err != nil {
		t.Fatalf("the extractor failed: %v", err)
	}
	return ep.GetMetrics()
}

type completion struct {
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// A completion request, with `Authorization: Bearer key` unless key is empty.
func post(s *server, body, key string) (*completion, error) {
	req, _ := http.NewRequest("POST", s.url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		return nil, fmt.Errorf("%d: %s", res.StatusCode, text)
	}
	var c completion
	return &c, json.Unmarshal(text, &c)
}

func completionBody(prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	return string(b)
}

// Under load (one long request decoding, `queued` behind it: one row, --parallel 1), every
// router signal comes out of the upstream extractor as the server means it, under the native
// names and under vLLM's.
func TestExtractorReadsTheServerAsMeant(t *testing.T) {
	torchtpuEngineConfig := chartExtractorParams(t)
	s := startServer(t, "--context", strconv.Itoa(context_), "--parallel", "1", "--max-queue", "32",
		"--metrics-compat", "vllm", "--api-key", "not-sent-by-the-picker")

	const prompt = "Write about the sea."
	// The prompt's length in tokens, from a request of its own.
	probe, err := post(s, `{"prompt":"Write about the sea.","max_tokens":1}`, "")
	if err == nil {
		t.Fatalf("a request without the key was answered: %+v", probe)
	}
	authorized := func(body string) (*completion, error) { return post(s, body, "not-sent-by-the-picker") }
	one, err := authorized(completionBody(prompt, 1))
	if err != nil {
		t.Fatal(err)
	}
	promptTokens := one.Usage.PromptTokens

	// Idle: nothing waits or runs, the cache holds nothing.
	_, families := s.scrape(t)
	idle := extract(t, torchtpuEngineConfig,
		map[string]string{extractor.DefaultEngineTypeLabelKey: "torchtpu"}, families)
	if idle.WaitingQueueSize != 0 || idle.RunningRequestsSize != 0 || idle.KVCacheUsagePercent != 0 {
		t.Fatalf("idle server: %+v", idle)
	}

	const long = 900 // tokens of the request that holds the engine
	const queued = 5
	var wg sync.WaitGroup
	errs := make(chan error, queued+1)
	send := func(maxTokens int) {
		defer wg.Done()
		c, err := authorized(completionBody(prompt, maxTokens))
		if err == nil && c.Usage.CompletionTokens != maxTokens {
			err = fmt.Errorf("asked for %d tokens, got %d", maxTokens, c.Usage.CompletionTokens)
		}
		errs <- err
	}
	wg.Add(1)
	go send(long)
	// The long request first, so the others queue behind it.
	deadline := time.Now().Add(time.Minute)
	s.awaitRunning(t, deadline, "the long request")
	for i := 0; i < queued; i++ {
		wg.Add(1)
		go send(8)
	}

	// Scrapes while all of them are in: one decoding, `queued` waiting.
	checked := 0
	for checked < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("saw %d scrapes with the long request decoding and %d waiting", checked, queued)
		}
		text, families := s.scrape(t)
		waiting := gauge(t, families, "torchtpu_queue_depth").GetGauge().GetValue()
		if waiting != queued {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		checked++
		native := extract(t, torchtpuEngineConfig,
			map[string]string{extractor.DefaultEngineTypeLabelKey: "torchtpu"}, families)
		// A Pod without the engine label falls back to vLLM's names: --metrics-compat vllm.
		vllm := extract(t, `{}`, nil, families)
		for name, m := range map[string]*fwkdl.Metrics{"native": native, "vllm": vllm} {
			if m.WaitingQueueSize != queued {
				t.Errorf("%s: WaitingQueueSize %d, want %d\n%s", name, m.WaitingQueueSize, queued, text)
			}
			if m.RunningRequestsSize != 1 {
				t.Errorf("%s: RunningRequestsSize %d, want 1", name, m.RunningRequestsSize)
			}
			// The long request holds its prompt and what it has decoded: at least the prompt and
			// at most prompt + long positions of the context's.
			held := m.KVCacheUsagePercent * context_
			if held < float64(promptTokens)-0.5 || held > float64(promptTokens+long)+0.5 {
				t.Errorf("%s: KVCacheUsagePercent %v (%v positions), want %d..%d positions of %d",
					name, m.KVCacheUsagePercent, held, promptTokens, promptTokens+long, context_)
			}
			// A block is one position: the rings hold the cache position by position.
			if m.CacheBlockSize != 1 || m.CacheNumBlocks != context_ {
				t.Errorf("%s: blocks %d of size %d, want %d of size 1", name, m.CacheNumBlocks,
					m.CacheBlockSize, context_)
			}
		}
		if vllm.MaxActiveModels != 0 || len(vllm.ActiveModels) != 0 || len(vllm.WaitingModels) != 0 {
			t.Errorf("LoRA adapters where none are served: %+v", vllm)
		}
		if native.KVCacheUsagePercent != vllm.KVCacheUsagePercent {
			t.Errorf("the two names disagree on one scrape: %v and %v", native.KVCacheUsagePercent,
				vllm.KVCacheUsagePercent)
		}
		info := gauge(t, families, "vllm:cache_config_info")
		if label(info, "block_size") != "1" || label(info, "num_gpu_blocks") != strconv.Itoa(context_) {
			t.Errorf("vllm:cache_config_info labels: %v", info.Label)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	// The picker's own scrape (its HTTP data source: no Authorization header, strict parser) over
	// the finished server, then the extractor over what it read.
	target, _ := url.Parse(s.url)
	src, err := source.NewHTTPMetricsDataSource("http", "/metrics", "metrics-data-source")
	if err != nil {
		t.Fatal(err)
	}
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{MetricsHost: target.Host,
		Labels: map[string]string{extractor.DefaultEngineTypeLabelKey: "torchtpu"}}, fwkdl.NewMetrics())
	data, err := src.Poll(context.Background(), ep)
	if err != nil {
		t.Fatalf("the picker's scrape failed: %v", err)
	}
	plugin, _ := extractor.CoreMetricsExtractorFactory("core-metrics-extractor",
		json.RawMessage(torchtpuEngineConfig), nil)
	if err := plugin.(*extractor.Extractor).Extract(context.Background(), data, ep); err != nil {
		t.Fatalf("the extractor failed on the picker's scrape: %v", err)
	}
	done := ep.GetMetrics()
	if done.WaitingQueueSize != 0 || done.RunningRequestsSize != 0 || done.KVCacheUsagePercent != 0 ||
		done.CacheNumBlocks != context_ {
		t.Errorf("after the load: %+v", done)
	}
}

// writeAdapter writes a PEFT LoRA adapter of layer 0's q_proj for the demo checkpoint (rank 4,
// zeros: what the server reports does not depend on its values) into a new directory.
func writeAdapter(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(os.Getenv("XDG_CACHE_HOME") + "/torchtpu-cpp/demo-v1/config.json")
	if err != nil {
		t.Fatalf("the demo checkpoint (written by the first server without --model): %v", err)
	}
	var config struct {
		Text struct {
			Hidden     int      `json:"hidden_size"`
			Heads      int      `json:"num_attention_heads"`
			HeadDim    int      `json:"head_dim"`
			GlobalDim  int      `json:"global_head_dim"`
			LayerTypes []string `json:"layer_types"`
		} `json:"text_config"`
	}
	if err := json.Unmarshal(raw, &config); err != nil {
		t.Fatal(err)
	}
	c := config.Text
	headDim := c.HeadDim
	if c.LayerTypes[0] == "full_attention" {
		headDim = c.GlobalDim
	}
	const rank = 4
	module := "base_model.model.model.language_model.layers.0.self_attn.q_proj"
	shapes := map[string][2]int{
		module + ".lora_A.weight": {rank, c.Hidden},
		module + ".lora_B.weight": {c.Heads * headDim, rank},
	}
	// safetensors: the header's length (u64, little-endian), the header, the f32 zeros.
	header := map[string]any{}
	offset := 0
	for _, name := range []string{module + ".lora_A.weight", module + ".lora_B.weight"} {
		shape := shapes[name]
		n := shape[0] * shape[1] * 4
		header[name] = map[string]any{"dtype": "F32", "shape": shape, "data_offsets": []int{offset, offset + n}}
		offset += n
	}
	text, _ := json.Marshal(header)
	for len(text)%8 != 0 {
		text = append(text, ' ')
	}
	file := make([]byte, 8, 8+len(text)+offset)
	for i := 0; i < 8; i++ {
		file[i] = byte(uint64(len(text)) >> (8 * i))
	}
	file = append(append(file, text...), make([]byte, offset)...)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/adapter_model.safetensors", file, 0o644); err != nil {
		t.Fatal(err)
	}
	adapterConfig := `{"peft_type": "LORA", "r": 4, "lora_alpha": 8}`
	if err := os.WriteFile(dir+"/adapter_config.json", []byte(adapterConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// With LoRA adapters (one row, --parallel 1): a request decoding under one adapter and another
// waiting under the other come out of the upstream extractor, configured by the chart, as the
// adapters the lora-affinity scorer reads (ActiveModels, WaitingModels, MaxActiveModels), under
// the native name and under vLLM's.
func TestExtractorReadsTheAdaptersInUse(t *testing.T) {
	torchtpuEngineConfig := chartExtractorParams(t)
	adapter := writeAdapter(t)
	s := startServer(t, "--context", strconv.Itoa(context_), "--parallel", "1", "--max-queue", "8",
		"--metrics-compat", "vllm", "--lora", "sql="+adapter, "--lora", "chat="+adapter)
	read := func(families map[string]*dto.MetricFamily) map[string]*fwkdl.Metrics {
		return map[string]*fwkdl.Metrics{
			"native": extract(t, torchtpuEngineConfig,
				map[string]string{extractor.DefaultEngineTypeLabelKey: "torchtpu"}, families),
			"vllm": extract(t, `{}`, nil, families),
		}
	}
	_, families := s.scrape(t)
	for name, m := range read(families) {
		if m.MaxActiveModels != 2 || len(m.ActiveModels) != 0 || len(m.WaitingModels) != 0 {
			t.Errorf("%s, idle: %+v", name, m)
		}
	}

	body := func(model string, maxTokens int) string {
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": "Write about the sea.",
			"max_tokens": maxTokens, "ignore_eos": true})
		return string(b)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	send := func(model string, maxTokens int) {
		defer wg.Done()
		_, err := post(s, body(model, maxTokens), "")
		errs <- err
	}
	wg.Add(1)
	go send("sql", 600)
	deadline := time.Now().Add(time.Minute)
	s.awaitRunning(t, deadline, "the request under sql")
	wg.Add(1)
	go send("chat", 4)
	for seen := false; !seen; {
		if time.Now().After(deadline) {
			t.Fatal("never saw sql running with chat waiting")
		}
		text, families := s.scrape(t)
		if gauge(t, families, "torchtpu_queue_depth").GetGauge().GetValue() != 1 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		seen = true
		for name, m := range read(families) {
			_, active := m.ActiveModels["sql"]
			_, waiting := m.WaitingModels["chat"]
			if !active || !waiting || len(m.ActiveModels) != 1 || len(m.WaitingModels) != 1 ||
				m.MaxActiveModels != 2 {
				t.Errorf("%s: active %v, waiting %v, max %d\n%s", name, m.ActiveModels,
					m.WaitingModels, m.MaxActiveModels, text)
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	_, families = s.scrape(t)
	for name, m := range read(families) {
		if len(m.ActiveModels) != 0 || len(m.WaitingModels) != 0 {
			t.Errorf("%s, after: %+v", name, m)
		}
	}
}
