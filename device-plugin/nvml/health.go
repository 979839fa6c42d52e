package nvml

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

const (
	watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError
	waitMillis    = 1000 // how long one Wait blocks, so Close is noticed promptly
)

// startEvents registers every GPU for critical XID and double-bit ECC events.
// Where events are not available, the polled checks of Health still run.
func (b *Backend) startEvents() {
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		b.log.Warn("NVML events unavailable, XID errors will not be seen", "error", ret)
		return
	}
	b.mu.Lock()
	for uuid, h := range b.handles {
		if h.parentUUID != "" {
			continue // events are registered on the GPU itself
		}
		if ret := h.dev.RegisterEvents(watchedEvents, set); ret != nvml.SUCCESS {
			b.log.Warn("cannot watch GPU events", "uuid", uuid, "error", ret)
		}
	}
	b.mu.Unlock()
	b.events, b.stop, b.done = set, make(chan struct{}), make(chan struct{})
	go b.watch()
}

func (b *Backend) watch() {
	defer close(b.done)
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		ev, ret := b.events.Wait(waitMillis)
		switch ret {
		case nvml.SUCCESS:
			b.record(ev)
		case nvml.ERROR_TIMEOUT:
		default:
			b.log.Warn("waiting for NVML events failed", "error", ret)
		}
	}
}

// record keeps a fault for the next Health call, and an XID as the GPU's
// last (its stat); application XIDs are no fault.
func (b *Backend) record(ev nvml.EventData) {
	var reason string
	switch {
	case ev.EventType&nvml.EventTypeXidCriticalError != 0:
		if ev.Device != nil {
			if uuid, ret := ev.Device.GetUUID(); ret == nvml.SUCCESS {
				b.mu.Lock()
				b.lastXID[uuid] = ev.EventData
				b.mu.Unlock()
			}
		}
		if b.ignored[ev.EventData] {
			b.log.Debug("ignoring application XID", "xid", ev.EventData)
			return
		}
		reason = fmt.Sprintf("XID %d critical error", ev.EventData)
	case ev.EventType&nvml.EventTypeDoubleBitEccError != 0:
		reason = "uncorrectable (double-bit) ECC error"
	default:
		return
	}
	if ev.Device == nil {
		// NVML could not say which GPU: every GPU is suspect.
		b.mu.Lock()
		for uuid, h := range b.handles {
			if h.parentUUID == "" {
				b.faults[uuid] = reason
			}
		}
		b.mu.Unlock()
		return
	}
	uuid, ret := ev.Device.GetUUID()
	if ret != nvml.SUCCESS {
		return
	}
	b.log.Warn("GPU fault", "uuid", uuid, "reason", reason)
	b.mu.Lock()
	b.faults[uuid] = reason
	b.mu.Unlock()
}

// Health reports, per device: faults from events since the last call, pending
// page retirement or row remapping, and a GPU that no longer answers. A MIG
// instance shares its parent GPU's condition.
func (b *Backend) Health(context.Context) (map[string]gpu.Health, error) {
	b.mu.Lock()
	handles, faults := b.handles, b.faults
	b.faults = map[string]string{}
	b.mu.Unlock()

	gpus := map[string]gpu.Health{}
	out := make(map[string]gpu.Health, len(handles))
	for uuid, h := range handles {
		if h.parentUUID != "" {
			continue
		}
		hl := check(h.dev)
		if reason, ok := faults[uuid]; ok && hl.Healthy {
			hl = gpu.Health{Reason: reason}
		}
		gpus[uuid] = hl
		out[uuid] = hl
	}
	for uuid, h := range handles {
		if h.parentUUID != "" {
			out[uuid] = gpus[h.parentUUID]
		}
	}
	return out, nil
}

// check polls the conditions NVML keeps rather than signals.
func check(dev nvml.Device) gpu.Health {
	pending, ret := dev.GetRetiredPagesPendingStatus()
	if ret == nvml.ERROR_GPU_IS_LOST {
		return gpu.Health{Reason: "GPU is lost: it no longer answers NVML (fallen off the bus?)"}
	}
	if ret == nvml.SUCCESS && pending == nvml.FEATURE_ENABLED {
		return gpu.Health{Reason: "retired memory pages pending: the GPU needs a reset"}
	}
	_, _, remapPending, remapFailed, ret := dev.GetRemappedRows()
	if ret == nvml.ERROR_GPU_IS_LOST {
		return gpu.Health{Reason: "GPU is lost: it no longer answers NVML (fallen off the bus?)"}
	}
	if ret == nvml.SUCCESS {
		if remapFailed {
			return gpu.Health{Reason: "memory row remapping failed: the GPU needs service"}
		}
		if remapPending {
			return gpu.Health{Reason: "memory row remapping pending: the GPU needs a reset"}
		}
	}
	return gpu.Healthy
}
