// Command anchor-kubelet is the kubelet's side of the benchmark in bench/real_api.py, built from
// the kubelet's own packages: its device-plugin registration server and plugin client
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1) and its DRA plugin manager and
// client (k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin). It times the calls itself and prints one
// JSON object on stdout: raw samples in seconds, which the Python side summarises.
//
//	anchor-kubelet setup -kubeconfig K -namespace NS -nodes a,b
//	anchor-kubelet dra-prepare -kubeconfig K -namespace NS -target name=N,driver=D,node=X,registration=SOCK,prefix=P,cdi=DIR ...
//	anchor-kubelet publish -kubeconfig K -node X -driver D -devices N [-wipes W] -- COMMAND ... {kubeconfig} ...
//	anchor-kubelet dp -dir DIR -resource R [-starts S] [-restarts R] [-calls C] -- COMMAND ...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	dpclient "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
)

// children are the processes started here, stopped by fail too.
var children struct {
	sync.Mutex
	cmds []*exec.Cmd
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "anchor-kubelet: "+format+"\n", args...)
	children.Lock()
	for _, cmd := range children.cmds {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}
	children.Unlock()
	os.Exit(1)
}

// start starts cmd, its output on this process's stderr, and remembers it.
func start(cmd *exec.Cmd) {
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		fail("start %s: %v", cmd.Path, err)
	}
	children.Lock()
	children.cmds = append(children.cmds, cmd)
	children.Unlock()
}

func printJSON(v any) {
	out, err := json.Marshal(v)
	if err != nil {
		fail("%v", err)
	}
	fmt.Println(string(out))
}

func clientFor(kubeconfig string) (*rest.Config, *kubernetes.Clientset) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	config.QPS, config.Burst = 1000, 1000 // the benchmark's own requests are never throttled
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	return config, client
}

func main() {
	klog.InitFlags(nil)
	if len(os.Args) < 2 {
		fail("usage: anchor-kubelet setup|dra-prepare|publish|dp [flags]")
	}
	command, args := os.Args[1], os.Args[2:]
	switch command {
	case "setup":
		setup(args)
	case "dra-prepare":
		draPrepare(args)
	case "publish":
		publish(args)
	case "dp":
		devicePlugin(args)
	default:
		fail("no command %q", command)
	}
}

// -- setup ---------------------------------------------------------------------------------------

// setup creates the namespace and the Node objects the drivers run on (nothing else runs there:
// the nodes have no kubelet).
func setup(args []string) {
	fs := flag.NewFlagSet("setup", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "")
	namespace := fs.String("namespace", "bench", "")
	nodes := fs.String("nodes", "", "comma-separated node names")
	_ = fs.Parse(args)
	_, client := clientFor(*kubeconfig)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: *namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		fail("namespace: %v", err)
	}
	for _, name := range strings.Split(*nodes, ",") {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			fail("node %s: %v", name, err)
		}
	}
	printJSON(map[string]any{"namespace": *namespace, "nodes": strings.Split(*nodes, ",")})
}

// -- DRA: NodePrepareResources / NodeUnprepareResources ---------------------------------------------

type target struct {
	name, driver, node, registration, prefix, cdi string

	plugin  *draplugin.DRAPlugin
	calls   int
	samples map[string][]float64
}

func parseTarget(text string) *target {
	t := &target{samples: map[string][]float64{}}
	for _, field := range strings.Split(text, ",") {
		key, value, _ := strings.Cut(field, "=")
		switch key {
		case "name":
			t.name = value
		case "driver":
			t.driver = value
		case "node":
			t.node = value
		case "registration":
			t.registration = value
		case "prefix":
			t.prefix = value
		case "cdi":
			t.cdi = value
		default:
			fail("-target: no key %q", key)
		}
	}
	if t.name == "" || t.driver == "" || t.node == "" || t.registration == "" {
		fail("-target %q: name, driver, node and registration are required", text)
	}
	return t
}

type targets []*target

func (ts *targets) String() string { return "" }
func (ts *targets) Set(v string) error {
	*ts = append(*ts, parseTarget(v))
	return nil
}

func waitForFile(path string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			fail("%s did not appear within %s", path, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// register does what the kubelet's plugin watcher does with a registration socket: GetInfo, the
// DRA handler's ValidatePlugin and RegisterPlugin, then NotifyRegistrationStatus.
func register(manager *draplugin.DRAPluginManager, socket string) string {
	waitForFile(socket, 60*time.Second)
	conn, err := grpc.NewClient("unix:"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("registration socket %s: %v", socket, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		fail("GetInfo on %s: %v", socket, err)
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: true}
	err = manager.ValidatePlugin(ctx, info.Name, info.Endpoint, info.SupportedVersions)
	if err == nil {
		err = manager.RegisterPlugin(ctx, info.Name, info.Endpoint, info.SupportedVersions, nil)
	}
	if err != nil {
		status = &registerapi.RegistrationStatus{PluginRegistered: false, Error: err.Error()}
	}
	if _, nerr := client.NotifyRegistrationStatus(ctx, status); nerr != nil {
		fail("NotifyRegistrationStatus on %s: %v", socket, nerr)
	}
	if err != nil {
		fail("registration of %s: %v", info.Name, err)
	}
	return info.Name
}

// allocatedClaim creates a claim of count devices and writes its allocation to its status, as the
// scheduler would (untimed).
func (t *target) allocatedClaim(ctx context.Context, client *kubernetes.Clientset, namespace, name string, count int) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "req",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: t.driver,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(count),
			},
		}}}},
	}
	created, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		fail("create claim %s: %v", name, err)
	}
	results := make([]resourceapi.DeviceRequestAllocationResult, count)
	for i := range results {
		results[i] = resourceapi.DeviceRequestAllocationResult{
			Request: "req", Driver: t.driver, Pool: t.node, Device: fmt.Sprintf("%s%d", t.prefix, i),
		}
	}
	created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	allocated, err := client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		fail("allocate claim %s: %v", name, err)
	}
	return allocated
}

// block prepares and unprepares calls claims of count devices, timing both.
func (t *target) block(client *kubernetes.Clientset, namespace string, count, calls int, record bool) {
	ctx := context.Background()
	for range calls {
		t.calls++
		name := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.name, "_", "-"), t.calls)
		claim := t.allocatedClaim(ctx, client, namespace, name, count)
		ref := []*drapb.Claim{{Namespace: namespace, Name: name, Uid: string(claim.UID)}}
		before := time.Now()
		answer, err := t.plugin.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: ref})
		prepared := time.Since(before)
		if err != nil {
			fail("%s: NodePrepareResources: %v", t.name, err)
		}
		entry := answer.Claims[string(claim.UID)]
		if entry == nil || entry.Error != "" || len(entry.Devices) != count {
			fail("%s: prepare of %s: %v", t.name, name, entry)
		}
		spec := ""
		if t.cdi != "" {
			spec = filepath.Join(t.cdi, fmt.Sprintf("k8s.%s-claim_%s.json", t.driver, claim.UID))
			if _, err := os.Stat(spec); err != nil {
				fail("%s: no CDI spec after prepare: %v", t.name, err)
			}
		}
		before = time.Now()
		answerU, err := t.plugin.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: ref})
		unprepared := time.Since(before)
		if err != nil {
			fail("%s: NodeUnprepareResources: %v", t.name, err)
		}
		if entry := answerU.Claims[string(claim.UID)]; entry == nil || entry.Error != "" {
			fail("%s: unprepare of %s: %v", t.name, name, entry)
		}
		if spec != "" {
			if _, err := os.Stat(spec); err == nil {
				fail("%s: CDI spec %s left after unprepare", t.name, spec)
			}
		}
		if err := client.ResourceV1().ResourceClaims(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			fail("delete claim %s: %v", name, err)
		}
		if record {
			key := strconv.Itoa(count)
			t.samples["prepare_"+key] = append(t.samples["prepare_"+key], prepared.Seconds())
			t.samples["unprepare_"+key] = append(t.samples["unprepare_"+key], unprepared.Seconds())
		}
	}
}

func draPrepare(args []string) {
	fs := flag.NewFlagSet("dra-prepare", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "")
	namespace := fs.String("namespace", "bench", "")
	calls := fs.Int("calls", 100, "timed calls per shape and target")
	warmup := fs.Int("warmup", 20, "untimed calls per shape and target first")
	blocks := fs.Int("blocks", 5, "the timed calls come in this many rounds over the targets")
	shapes := fs.String("shapes", "1,8", "devices per claim")
	var ts targets
	fs.Var(&ts, "target", "name=N,driver=D,node=X,registration=SOCKET[,prefix=P][,cdi=DIR] (repeatable)")
	_ = fs.Parse(args)
	_, client := clientFor(*kubeconfig)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No API client: the kubelet's wiping of ResourceSlices at start is measured apart (publish).
	manager := draplugin.NewDRAPluginManager(ctx, nil, nil, nil, time.Minute)
	defer manager.Stop()
	for _, t := range ts {
		if got := register(manager, t.registration); got != t.driver {
			fail("%s registered as %q, not %q", t.registration, got, t.driver)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			plugin, err := manager.GetPlugin(t.driver)
			if err == nil {
				t.plugin = plugin
				break
			}
			if time.Now().After(deadline) {
				fail("driver %s: %v", t.driver, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var counts []int
	for _, s := range strings.Split(*shapes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail("-shapes: %v", err)
		}
		counts = append(counts, n)
	}
	for _, t := range ts {
		for _, n := range counts {
			t.block(client, *namespace, n, *warmup, false)
		}
	}
	rounds := max(1, min(*blocks, *calls))
	per := max(1, *calls/rounds)
	for round := range rounds {
		order := ts
		if round%2 == 1 { // the order swapped every round: a slow spell falls on both
			order = append(targets{}, ts...)
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, t := range order {
			for _, n := range counts {
				t.block(client, *namespace, n, per, true)
			}
		}
	}
	out := map[string]any{}
	for _, t := range ts {
		out[t.name] = t.samples
	}
	printJSON(map[string]any{"client": "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin (DRAPluginManager)", "targets": out})
}

// -- the node's pool, watched in the API server ------------------------------------------------------

// poolWatch follows the ResourceSlices of one node and driver and notes when the pool becomes
// complete: resourceSliceCount slices at the highest generation, holding every device.
type poolWatch struct {
	client  *kubernetes.Clientset
	node    string
	driver  string
	devices int

	mu         sync.Mutex
	slices     map[string]*resourceapi.ResourceSlice
	complete   bool
	completeAt time.Time
	events     int
	changed    chan struct{}
}

func (w *poolWatch) selector() string {
	return fields.Set{resourceapi.ResourceSliceSelectorNodeName: w.node, resourceapi.ResourceSliceSelectorDriver: w.driver}.String()
}

// evaluateLocked recomputes completeness after a change seen at `at`; w.mu is held.
func (w *poolWatch) evaluateLocked(at time.Time) {
	w.events++
	var top int64 = -1
	for _, s := range w.slices {
		top = max(top, s.Spec.Pool.Generation)
	}
	names := map[string]struct{}{}
	current, count := 0, int64(-1)
	ok := top >= 0
	for _, s := range w.slices {
		if s.Spec.Pool.Generation != top {
			continue
		}
		current++
		if count >= 0 && count != s.Spec.Pool.ResourceSliceCount {
			ok = false
		}
		count = s.Spec.Pool.ResourceSliceCount
		for _, d := range s.Spec.Devices {
			names[d.Name] = struct{}{}
		}
	}
	ok = ok && int64(current) == count && len(names) == w.devices
	if ok && !w.complete {
		w.completeAt = at
	}
	w.complete = ok
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *poolWatch) run(ctx context.Context, synced chan<- struct{}) {
	first := true
	for ctx.Err() == nil {
		list, err := w.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: w.selector()})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		w.mu.Lock()
		w.slices = map[string]*resourceapi.ResourceSlice{}
		for i := range list.Items {
			w.slices[list.Items[i].Name] = &list.Items[i]
		}
		w.evaluateLocked(time.Now())
		w.mu.Unlock()
		watcher, err := w.client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{
			FieldSelector: w.selector(), ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true,
		})
		if first {
			first = false
			close(synced)
		}
		if err != nil {
			continue
		}
		for event := range watcher.ResultChan() {
			at := time.Now()
			slice, ok := event.Object.(*resourceapi.ResourceSlice)
			if !ok {
				continue
			}
			w.mu.Lock()
			switch event.Type {
			case watch.Added, watch.Modified:
				w.slices[slice.Name] = slice
			case watch.Deleted:
				delete(w.slices, slice.Name)
			default:
				w.mu.Unlock()
				continue
			}
			w.evaluateLocked(at)
			w.mu.Unlock()
		}
		watcher.Stop()
	}
}

// waitComplete returns the time the pool last became complete, once that is after `since`.
func (w *poolWatch) waitComplete(since time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		complete, at, changed := w.complete, w.completeAt, w.changed
		w.mu.Unlock()
		if complete && !at.Before(since) {
			return at, nil
		}
		select {
		case <-changed:
		case <-deadline:
			return time.Time{}, fmt.Errorf("the pool of %s on %s was not complete within %s", w.driver, w.node, timeout)
		}
	}
}

func (w *poolWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.slices)
}

// firstConnection is a TCP relay in front of the API server that notes when the first
// connection arrived: the driver's first API request, once its start-up is done.
type firstConnection struct {
	listener net.Listener
	target   string
	first    atomic.Int64
}

func (p *firstConnection) serve() {
	for {
		conn, err := p.listener.Accept()
		if err != nil {
			return
		}
		p.first.CompareAndSwap(0, time.Now().UnixNano())
		go func() {
			defer func() { _ = conn.Close() }()
			upstream, err := net.Dial("tcp", p.target)
			if err != nil {
				return
			}
			defer func() { _ = upstream.Close() }()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(upstream, conn); done <- struct{}{} }()
			go func() { _, _ = io.Copy(conn, upstream); done <- struct{}{} }()
			<-done
		}()
	}
}

// relayKubeconfig writes a copy of kubeconfig whose server is the relay (the API server's
// certificate names 127.0.0.1, which the relay's address is too).
func relayKubeconfig(kubeconfig, out string, config *rest.Config) *firstConnection {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("relay: %v", err)
	}
	host := strings.TrimPrefix(config.Host, "https://")
	relay := &firstConnection{listener: listener, target: host}
	go relay.serve()
	raw, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	for _, cluster := range raw.Clusters {
		cluster.Server = "https://" + listener.Addr().String()
	}
	if err := clientcmd.WriteToFile(*raw, out); err != nil {
		fail("write %s: %v", out, err)
	}
	return relay
}

func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	text := string(data)
	fieldsAfter := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
	utime, _ := strconv.ParseFloat(fieldsAfter[11], 64)
	stime, _ := strconv.ParseFloat(fieldsAfter[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func stopProcess(cmd *exec.Cmd) {
	if cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// publish starts the driver and times its pool's publication, then optional wipes (the kubelet's
// DeleteCollection of the node's ResourceSlices) until the pool is complete again.
func publish(args []string) {
	fs := flag.NewFlagSet("publish", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "")
	node := fs.String("node", "", "")
	driver := fs.String("driver", "", "")
	devices := fs.Int("devices", 1000, "")
	wipes := fs.Int("wipes", 0, "wipes after the publication")
	pause := fs.Duration("wipe-pause", 500*time.Millisecond, "between wipes")
	timeout := fs.Duration("timeout", 120*time.Second, "for each wait")
	relayOut := fs.String("relay-kubeconfig", "", "where the kubeconfig through the relay is written")
	_ = fs.Parse(args)
	command := fs.Args()
	if len(command) == 0 || *relayOut == "" {
		fail("publish: a -relay-kubeconfig and a command after -- are required")
	}
	config, client := clientFor(*kubeconfig)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &poolWatch{client: client, node: *node, driver: *driver, devices: *devices, changed: make(chan struct{})}
	wipe := func() error {
		return client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: fields.Set{resourceapi.ResourceSliceSelectorNodeName: *node}.String()})
	}
	if err := wipe(); err != nil { // what an earlier run left
		fail("clean-up: %v", err)
	}
	synced := make(chan struct{})
	go w.run(ctx, synced)
	<-synced
	relay := relayKubeconfig(*kubeconfig, *relayOut, config)
	for i, arg := range command {
		command[i] = strings.ReplaceAll(arg, "{kubeconfig}", *relayOut)
	}
	cmd := exec.Command(command[0], command[1:]...)
	began := time.Now()
	start(cmd)
	defer stopProcess(cmd)
	done, err := w.waitComplete(began, *timeout)
	if err != nil {
		fail("%v", err)
	}
	driverCPU := cpuSeconds(cmd.Process.Pid)
	first := time.Unix(0, relay.first.Load())
	out := map[string]any{
		"devices":                   *devices,
		"slices":                    w.count(),
		"start_to_complete":         done.Sub(began).Seconds(),
		"start_to_first_request":    first.Sub(began).Seconds(),
		"first_request_to_complete": done.Sub(first).Seconds(),
		"driver_cpu":                driverCPU,
	}
	var samples []float64
	if *wipes > 0 {
		time.Sleep(*pause)
		for range *wipes {
			before := time.Now()
			if err := wipe(); err != nil {
				fail("wipe: %v", err)
			}
			again, err := w.waitComplete(before, *timeout)
			if err != nil {
				fail("after a wipe: %v", err)
			}
			samples = append(samples, again.Sub(before).Seconds())
			time.Sleep(*pause)
		}
		out["wipe_to_complete"] = samples
	}
	stopProcess(cmd)
	if err := wipe(); err != nil {
		fail("clean-up: %v", err)
	}
	printJSON(out)
}

// -- device plugins ------------------------------------------------------------------------------

// handler is the device manager's side of the kubelet's plugin server, reduced to what the
// benchmark needs: it notes every connection (the kubelet returns from Register after it) and
// the first device list of each.
type handler struct {
	dir string

	mu        sync.Mutex
	connected []time.Time
	plugin    dpclient.DevicePlugin
	lists     int
	listed    []time.Time
	devices   []string
	changed   chan struct{}
}

func (h *handler) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// CleanupPluginDirectory removes every file of the plugin directory but the checkpoint, as the
// kubelet's device manager does when it starts.
func (h *handler) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, entry := range entries {
		if entry.IsDir() || entry.Name() == "kubelet_internal_checkpoint" {
			continue
		}
		if err := os.Remove(filepath.Join(dir, entry.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (h *handler) PluginConnected(_ context.Context, _ string, plugin dpclient.DevicePlugin) error {
	at := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.connected = append(h.connected, at)
	h.plugin = plugin
	h.notify()
	return nil
}

func (h *handler) PluginDisconnected(klog.Logger, string, string) {}

func (h *handler) PluginListAndWatchReceiver(_ klog.Logger, _ string, response *dpapi.ListAndWatchResponse) {
	at := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lists++
	h.listed = append(h.listed, at)
	h.devices = h.devices[:0]
	for _, d := range response.Devices {
		h.devices = append(h.devices, d.ID)
	}
	h.notify()
}

// waitFor waits until cond (called with h.mu held) holds.
func (h *handler) waitFor(cond func() bool, timeout time.Duration) {
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		ok, changed := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			fail("device plugin: timed out after %s", timeout)
		}
	}
}

func startServer(h *handler, socket string) dpclient.Server {
	server, err := dpclient.NewServer(klog.Background(), socket, h, h)
	if err != nil {
		fail("registration server: %v", err)
	}
	if err := server.Start(klog.Background()); err != nil {
		fail("registration server: %v", err)
	}
	return server
}

func spawn(command []string) *exec.Cmd {
	cmd := exec.Command(command[0], command[1:]...)
	start(cmd)
	return cmd
}

// devicePlugin times, through the kubelet's registration server and plugin client: process start
// → Register (the kubelet dials the plugin back before answering), kubelet restart → Register,
// plugin restart (SIGTERM, exit, start) → Register, and Allocate round trips.
func devicePlugin(args []string) {
	fs := flag.NewFlagSet("dp", flag.ExitOnError)
	_ = fs.String("kubeconfig", "", "unused: device plugins need no API server")
	dir := fs.String("dir", "", "the device-plugin directory (kubelet.sock is made there)")
	starts := fs.Int("starts", 5, "process starts")
	restarts := fs.Int("restarts", 20, "kubelet restarts")
	pluginRestarts := fs.Int("plugin-restarts", 5, "plugin restarts")
	calls := fs.Int("calls", 1000, "timed Allocate calls per shape")
	warmup := fs.Int("warmup", 200, "untimed Allocate calls per shape first")
	_ = fs.Parse(args)
	command := fs.Args()
	if *dir == "" || len(command) == 0 {
		fail("dp: -dir and a command after -- are required")
	}
	socket := filepath.Join(*dir, "kubelet.sock") // dpapi.KubeletSocket is the full default path
	h := &handler{dir: *dir, changed: make(chan struct{})}
	registered := func(n int) func() bool { return func() bool { return len(h.connected) >= n } }
	listed := func(n int) func() bool { return func() bool { return h.lists >= n && len(h.devices) > 0 } }
	out := map[string]any{"client": "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"}

	var toRegister, toList []float64
	for range *starts {
		server := startServer(h, socket)
		h.mu.Lock()
		seen, lists := len(h.connected), h.lists
		h.mu.Unlock()
		began := time.Now()
		cmd := spawn(command)
		h.waitFor(registered(seen+1), 60*time.Second)
		h.waitFor(listed(lists+1), 60*time.Second)
		h.mu.Lock()
		toRegister = append(toRegister, h.connected[seen].Sub(began).Seconds())
		toList = append(toList, h.listed[lists].Sub(began).Seconds())
		h.mu.Unlock()
		stopProcess(cmd)
		_ = server.Stop(klog.Background())
	}
	out["start_to_register"], out["start_to_first_list"] = toRegister, toList

	server := startServer(h, socket)
	h.mu.Lock()
	seen := len(h.connected)
	h.mu.Unlock()
	cmd := spawn(command)
	defer func() { stopProcess(cmd) }()
	h.waitFor(registered(seen+1), 60*time.Second)
	h.waitFor(listed(h.lists+1), 60*time.Second)

	var kubeletRestart []float64
	for range *restarts {
		_ = server.Stop(klog.Background())
		h.mu.Lock()
		seen := len(h.connected)
		h.mu.Unlock()
		began := time.Now() // the new server removes the old sockets and makes kubelet.sock afresh
		server = startServer(h, socket)
		h.waitFor(registered(seen+1), 30*time.Second)
		h.mu.Lock()
		kubeletRestart = append(kubeletRestart, h.connected[seen].Sub(began).Seconds())
		h.mu.Unlock()
	}
	out["kubelet_restart_to_register"] = kubeletRestart

	var pluginRestart []float64
	for range *pluginRestarts {
		h.mu.Lock()
		seen := len(h.connected)
		h.mu.Unlock()
		began := time.Now()
		stopProcess(cmd)
		cmd = spawn(command)
		h.waitFor(registered(seen+1), 60*time.Second)
		h.mu.Lock()
		pluginRestart = append(pluginRestart, h.connected[seen].Sub(began).Seconds())
		h.mu.Unlock()
	}
	out["plugin_restart_to_register"] = pluginRestart

	h.waitFor(func() bool { return len(h.devices) >= 8 }, 30*time.Second)
	h.mu.Lock()
	plugin, ids := h.plugin, append([]string{}, h.devices...)
	h.mu.Unlock()
	for _, n := range []int{1, 8} {
		request := &dpapi.AllocateRequest{ContainerRequests: []*dpapi.ContainerAllocateRequest{{DevicesIds: ids[:n]}}}
		var samples []float64
		for i := range *warmup + *calls {
			before := time.Now()
			if _, err := plugin.API().Allocate(context.Background(), request); err != nil {
				fail("Allocate: %v", err)
			}
			if i >= *warmup {
				samples = append(samples, time.Since(before).Seconds())
			}
		}
		out[fmt.Sprintf("allocate_%d", n)] = samples
	}
	stopProcess(cmd)
	_ = server.Stop(klog.Background())
	printJSON(out)
}
