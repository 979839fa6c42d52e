package metrics

import (
	"cmp"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// dcgmLabels are dcgm-exporter's per-GPU labels, so that dashboards built on
// it read these series unchanged. Then comes the Nomad attribution a
// job-mapping file gives DCGM: namespace and tenant from the policy, then
// Nomad's own identifiers of the holder, as Nomad labels its allocation
// metrics. A
// dispatched or periodic child counts under its parent's id in nomad_job,
// which changes less often than alloc_id (every reschedule, deployment
// and periodic run makes a new allocation).
var dcgmLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "GPU_I_PROFILE", "GPU_I_ID",
	"DCGM_FI_DRIVER_VERSION", "namespace", "tenant", "alloc_id", "nomad_job", "task_group", "task"}

// xidLabels are the XID series' own besides: the last XID's number and what
// it means (xidMeaning), as dcgm-exporter labels it.
var xidLabels = []string{"err_code", "err_msg"}

// dcgmField is one DCGM field as dcgm-exporter names and types it, and how
// a GPU on the map gives its value.
type dcgmField struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(g cluster.MapGPU) *float64
}

func dcgmDesc(name, help string, more ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help+" (DCGM's name; from the device plugin's stats through Nomad, at the leader's last sample)",
		append(append([]string(nil), dcgmLabels...), more...), nil)
}

var dcgmFields = []dcgmField{
	{dcgmDesc("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.Utilization }},
	{dcgmDesc("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.MemoryUsed }},
	{dcgmDesc("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 {
			if g.MemoryUsed == nil || g.MemoryTotal == nil {
				return nil
			}
			free := max(*g.MemoryTotal-*g.MemoryUsed, 0)
			return &free
		}},
	{dcgmDesc("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.Temperature }},
	{dcgmDesc("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.Power }},
	{dcgmDesc("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.SMClock }},
	{dcgmDesc("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.MemClock }},
	{dcgmDesc("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.MemCopyUtil }},
	{dcgmDesc("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.EncoderUtil }},
	{dcgmDesc("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.DecoderUtil }},
	// A profiling field: a ratio, as dcgm-exporter serves it; only GPUs
	// with GPM (Hopper and later) have it, the others leave it out.
	{dcgmDesc("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Share of time any tensor pipe was active (a ratio, 0 to 1)."), prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 {
			if g.TensorActive == nil {
				return nil
			}
			r := *g.TensorActive / 100
			return &r
		}},
	{xidDesc, prometheus.GaugeValue,
		func(g cluster.MapGPU) *float64 { return g.LastXID }},
	{dcgmDesc("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors (corrected, since the driver loaded)."), prometheus.CounterValue,
		func(g cluster.MapGPU) *float64 { return g.ECCCorrected }},
	{dcgmDesc("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors (uncorrected, since the driver loaded)."), prometheus.CounterValue,
		func(g cluster.MapGPU) *float64 { return g.ECCUncorrected }},
}

// xidDesc is the XID field's, which carries xidLabels too.
var xidDesc = dcgmDesc("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none since the plugin started).", xidLabels...)

// xidMeaning is what an XID says, in short, for the err_msg label: the
// ones an operator acts on; others are named by number only.
func xidMeaning(xid int) string {
	switch xid {
	case 0:
		return "No error"
	case 13:
		return "Graphics engine exception (usually the application)"
	case 31:
		return "GPU memory page fault (usually the application)"
	case 43:
		return "GPU stopped processing (usually the application)"
	case 45:
		return "Preemptive cleanup after an earlier error"
	case 48:
		return "Double-bit ECC error"
	case 61, 62:
		return "Internal micro-controller error"
	case 63, 64:
		return "ECC page retirement or row remapping event"
	case 74:
		return "NVLink error"
	case 79:
		return "GPU has fallen off the bus"
	case 92:
		return "High single-bit ECC error rate"
	case 94:
		return "Contained ECC error"
	case 95:
		return "Uncontained ECC error"
	case 119, 120:
		return "GSP error"
	}
	return "XID " + strconv.Itoa(xid)
}

// dcgm reports the map's sampled GPUs under DCGM's names. A shared GPU's
// replicas carry its samples each: one series per GPU and holder.
func (c *scrape) dcgm(ch chan<- prometheus.Metric, p *policy.Policy, nodes []cluster.MapNode) {
	seen := map[string]bool{}
	for _, n := range nodes {
		for _, g := range n.GPUs {
			if g.GPUUUID == "" {
				continue // not sampled, or a plugin that does not say which GPU it is
			}
			labels := dcgmLabelValues(p, n, g)
			key := strings.Join(labels, "\x00")
			if seen[key] {
				continue
			}
			seen[key] = true
			for _, f := range dcgmFields {
				v := f.value(g)
				if v == nil {
					continue
				}
				values := labels
				if f.desc == xidDesc {
					code := strconv.Itoa(int(*v))
					values = append(append([]string(nil), labels...), code, xidMeaning(int(*v)))
				}
				ch <- prometheus.MustNewConstMetric(f.desc, f.kind, *v, values...)
			}
		}
	}
}

// dcgmLabelValues are g's values of dcgmLabels.
func dcgmLabelValues(p *policy.Policy, n cluster.MapNode, g cluster.MapGPU) []string {
	index, device, instance := "", "", ""
	if g.GPUIndex != nil {
		index = strconv.Itoa(int(*g.GPUIndex))
		device = "nvidia" + index
	}
	if g.MIGInstance != nil {
		instance = strconv.Itoa(int(*g.MIGInstance))
	}
	namespace, tenant, alloc, job, group, task := "", "", "", "", "", ""
	if t := p.TenantOf(g.Namespace); t != nil {
		namespace, tenant = g.Namespace, t.Name
	}
	if queue.ValidID(g.Alloc) { // Nomad's allocation ids have a queue id's form
		alloc, job, group, task = g.Alloc, cmp.Or(g.ParentJob, g.Job), g.Group, g.Task
	}
	return []string{index, g.GPUUUID, device, modelName(g.Model), n.Name, dcgmBusID(g.PCIBusID), g.MIGProfile, instance,
		g.DriverVersion, namespace, tenant, alloc, job, group, task}
}

// modelName is the GPU's product name, as DCGM's modelName has it, from its
// device group's: a shared group's without " (shared)", an island group's
// without " (island N)", a MIG instance's without its " MIG <profile>".
func modelName(group string) string {
	name := policy.IslandModel(strings.TrimSuffix(group, nomadjob.SharedSuffix))
	if i := strings.LastIndex(name, " MIG "); i >= 0 {
		name = name[:i]
	}
	return name
}

// dcgmBusID is a PCI bus id in DCGM's form ("00000000:3B:00.0") from the
// sysfs form the plugin reports ("0000:3b:00.0").
func dcgmBusID(id string) string {
	if id == "" {
		return ""
	}
	domain, rest, ok := strings.Cut(strings.ToUpper(id), ":")
	if !ok {
		return strings.ToUpper(id)
	}
	return strings.Repeat("0", max(8-len(domain), 0)) + domain + ":" + rest
}
