package nvml

import (
	"sort"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// islands numbers the NVLink islands of a host's GPUs (devs[i] described by
// described[i]). GPUs joined by an active NVLink, directly or through an
// NVSwitch, are one island: every GPU on the switches is one, as the fabric
// connects them all. A GPU with no active NVLink is in its NUMA node's
// island, or alone when NVML does not tell its NUMA node. Islands
// are numbered from 0 in the order of their first GPU's PCI bus id.
func islands(devs []nvml.Device, described []gpu.Device) []int64 {
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		if p, ok := parent[x]; ok && p != x {
			root := find(p)
			parent[x] = root
			return root
		}
		parent[x] = x
		return x
	}
	union := func(a, b string) { parent[find(a)] = find(b) }

	byBus := map[string]int{}
	for i, d := range described {
		byBus[d.PCIBusID] = i
	}
	for i, dev := range devs {
		self := "gpu:" + described[i].PCIBusID
		find(self)
		linked := false
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			state, ret := dev.GetNvLinkState(link)
			if ret != nvml.SUCCESS {
				break
			}
			if state != nvml.FEATURE_ENABLED {
				continue
			}
			kind, ret := dev.GetNvLinkRemoteDeviceType(link)
			if ret != nvml.SUCCESS {
				continue
			}
			switch kind {
			case nvml.NVLINK_DEVICE_TYPE_SWITCH:
				union(self, "nvswitch")
				linked = true
			case nvml.NVLINK_DEVICE_TYPE_GPU:
				pci, ret := dev.GetNvLinkRemotePciInfo(link)
				if ret != nvml.SUCCESS {
					continue
				}
				if _, ok := byBus[SysfsBusID(pci.BusId)]; ok {
					union(self, "gpu:"+SysfsBusID(pci.BusId))
					linked = true
				}
			}
		}
		if !linked && described[i].NUMANode != gpu.Unknown {
			union(self, "numa:"+strconv.FormatInt(described[i].NUMANode, 10))
		}
	}
	order := make([]int, len(described))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return described[order[a]].PCIBusID < described[order[b]].PCIBusID })
	number := map[string]int64{}
	out := make([]int64, len(described))
	for _, i := range order {
		root := find("gpu:" + described[i].PCIBusID)
		n, ok := number[root]
		if !ok {
			n = int64(len(number))
			number[root] = n
		}
		out[i] = n
	}
	return out
}
