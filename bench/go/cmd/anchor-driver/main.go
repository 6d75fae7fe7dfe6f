// Command anchor-driver is the benchmark's Go reference point for devplug's DRA driver: a
// minimal driver on the kubeletplugin helper of k8s.io/dynamic-resource-allocation.
//
// It publishes -devices devices (dev-0, dev-1, ...) in one pool named after the node, in slices
// of at most 128 devices, through the helper's PublishResources. Preparing a claim writes one
// CDI spec for it (<cdi-dir>/k8s.<driver>-claim_<uid>.json) and the JSON checkpoint of every
// prepared claim, both atomically (a temporary file renamed into place; the checkpoint is
// fsynced first). A claim prepared again answers what the checkpoint holds; unpreparing removes
// the spec and the claim's checkpoint entry. It stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const maxDevicesPerSlice = 128

// preparedDevice is one device of a prepared claim, as the checkpoint keeps it.
type preparedDevice struct {
	Request string   `json:"request"`
	Pool    string   `json:"pool"`
	Device  string   `json:"device"`
	CDIIDs  []string `json:"cdiDeviceIDs"`
}

// preparedClaim is one entry of the checkpoint.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
}

type checkpointFile struct {
	Version int                         `json:"version"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

type driver struct {
	name       string
	cdiDir     string
	checkpoint string

	mu     sync.Mutex
	claims map[types.UID]preparedClaim
}

// cdiSpec is the subset of the CDI specification this driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("k8s.%s-claim_%s.json", d.name, uid))
}

// writeAtomically writes data to path through a temporary file in the same directory.
func writeAtomically(path string, data []byte, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			_ = tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// saveLocked writes the checkpoint; d.mu is held.
func (d *driver) saveLocked() error {
	data, err := json.Marshal(checkpointFile{Version: 1, Claims: d.claims})
	if err != nil {
		return err
	}
	return writeAtomically(d.checkpoint, data, true)
}

func (d *driver) load() error {
	data, err := os.ReadFile(d.checkpoint)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var file checkpointFile
	if err := json.Unmarshal(data, &file); err != nil {
		return fmt.Errorf("checkpoint %s: %w", d.checkpoint, err)
	}
	if file.Claims != nil {
		d.claims = file.Claims
	}
	return nil
}

// prepareOne writes the claim's CDI spec and returns its checkpoint entry; d.mu is held.
func (d *driver) prepareOne(claim *resourceapi.ResourceClaim) (preparedClaim, error) {
	if done, ok := d.claims[claim.UID]; ok {
		return done, nil
	}
	entry := preparedClaim{Namespace: claim.Namespace, Name: claim.Name}
	if claim.Status.Allocation == nil {
		return entry, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	spec := cdiSpec{Version: "0.6.0", Kind: "k8s." + d.name + "/claim"}
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != d.name {
			continue
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		spec.Devices = append(spec.Devices, cdiDevice{
			Name:           name,
			ContainerEdits: cdiEdits{Env: []string{fmt.Sprintf("ANCHOR_DEVICE_%s=%s", result.Device, result.Device)}},
		})
		entry.Devices = append(entry.Devices, preparedDevice{
			Request: result.Request,
			Pool:    result.Pool,
			Device:  result.Device,
			CDIIDs:  []string{fmt.Sprintf("k8s.%s/claim=%s", d.name, name)},
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return entry, err
	}
	if err := writeAtomically(d.specPath(claim.UID), data, false); err != nil {
		return entry, fmt.Errorf("CDI spec of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return entry, nil
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		entry, err := d.prepareOne(claim)
		if err != nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.claims[claim.UID] = entry
		var devices []kubeletplugin.Device
		for _, dev := range entry.Devices {
			devices = append(devices, kubeletplugin.Device{
				Requests:     []string{dev.Request},
				PoolName:     dev.Pool,
				DeviceName:   dev.Device,
				CDIDeviceIDs: dev.CDIIDs,
			})
		}
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	if err := d.saveLocked(); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return results, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		results[claim.UID] = err
		delete(d.claims, claim.UID)
	}
	if err := d.saveLocked(); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return results, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// pool is the node's pool of count devices, in slices of at most maxDevicesPerSlice.
func pool(count int) resourceslice.Pool {
	var slices []resourceslice.Slice
	for first := 0; first < count || first == 0; first += maxDevicesPerSlice {
		var devices []resourceapi.Device
		for i := first; i < count && i < first+maxDevicesPerSlice; i++ {
			devices = append(devices, resourceapi.Device{
				Name: fmt.Sprintf("dev-%d", i),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"index": {IntValue: ptrTo(int64(i))},
				},
			})
		}
		slices = append(slices, resourceslice.Slice{Devices: devices})
		if count == 0 {
			break
		}
	}
	return resourceslice.Pool{Slices: slices}
}

func ptrTo[T any](v T) *T { return &v }

func run() error {
	var (
		driverName  = flag.String("driver-name", "anchor.example.com", "the DRA driver name")
		nodeName    = flag.String("node-name", "", "the node this driver runs on (required)")
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
		pluginDir   = flag.String("plugin-dir", "", "the driver's kubelet plugin directory (default /var/lib/kubelet/plugins/<driver>)")
		registryDir = flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
		cdiDir      = flag.String("cdi-dir", "/var/run/cdi", "where CDI specs are written")
		devices     = flag.Int("devices", 8, "devices to publish")
		qps         = flag.Float64("kube-api-qps", 1000, "client-side request rate limit (client-go's default is 5)")
		burst       = flag.Int("kube-api-burst", 1000, "client-side burst (client-go's default is 10)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *nodeName == "" || *kubeconfig == "" {
		return errors.New("-node-name and -kubeconfig are required")
	}
	if *pluginDir == "" {
		*pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, *driverName)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = float32(*qps), *burst
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	for _, dir := range []string{*pluginDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	d := &driver{
		name:       *driverName,
		cdiDir:     *cdiDir,
		checkpoint: filepath.Join(*pluginDir, "checkpoint.json"),
		claims:     map[types.UID]preparedClaim{},
	}
	if err := d.load(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(*driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*nodeName: pool(*devices)}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	<-ctx.Done()
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "anchor-driver:", err)
		os.Exit(1)
	}
}
