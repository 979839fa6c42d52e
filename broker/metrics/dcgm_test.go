package metrics

import "testing"

// DCGM's modelName is the product's name whatever group the plugin offers
// the device in, and its pci_bus_id DCGM's form of the plugin's sysfs one.
func TestDCGMModelNameAndBusID(t *testing.T) {
	for group, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":               "NVIDIA H100 80GB HBM3",
		"NVIDIA H100 80GB HBM3 (shared)":      "NVIDIA H100 80GB HBM3",
		"NVIDIA H100 80GB HBM3 (island 1)":    "NVIDIA H100 80GB HBM3",
		"NVIDIA H100 80GB HBM3 MIG 3g.40gb":   "NVIDIA H100 80GB HBM3",
		"NVIDIA H100 80GB HBM3 (island x)":    "NVIDIA H100 80GB HBM3 (island x)",
		"NVIDIA A100-SXM4-40GB MIG 1g.5gb+me": "NVIDIA A100-SXM4-40GB",
	} {
		if got := modelName(group); got != want {
			t.Errorf("modelName(%q) = %q, want %q", group, got, want)
		}
	}
	for id, want := range map[string]string{"0000:3b:00.0": "00000000:3B:00.0", "0001:c1:00.0": "00000001:C1:00.0", "": ""} {
		if got := dcgmBusID(id); got != want {
			t.Errorf("dcgmBusID(%q) = %q, want %q", id, got, want)
		}
	}
}
