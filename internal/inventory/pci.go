package inventory

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// NVIDIA's PCI vendor ID, and the PCI classes (base class and subclass, the
// upper 16 bits of the 24-bit class) of its GPUs: VGA-compatible display
// controllers and 3D controllers. The same card's audio and USB functions
// have other classes and are not GPUs.
const (
	PCIVendorNVIDIA = 0x10de
	pciClassVGA     = 0x0300
	pciClass3D      = 0x0302
)

// MaxPCIDevices is the most GPUs a GPUNode lists (the API's limit).
const MaxPCIDevices = 64

// pciProducts names the common datacenter GPUs by PCI device ID, in NVML's
// words (what nvidia-smi prints), so that the product read from PCI before
// the driver is there matches the one NVML reports afterwards.
var pciProducts = map[uint16]string{
	0x20b0: "NVIDIA A100-SXM4-40GB",
	0x20b2: "NVIDIA A100-SXM4-80GB",
	0x20b1: "NVIDIA A100-PCIE-40GB",
	0x20f1: "NVIDIA A100-PCIE-40GB",
	0x20b5: "NVIDIA A100 80GB PCIe",
	0x20b7: "NVIDIA A30",
	0x2236: "NVIDIA A10",
	0x2330: "NVIDIA H100 80GB HBM3",
	0x2331: "NVIDIA H100 PCIe",
	0x2321: "NVIDIA H100 NVL",
	0x2335: "NVIDIA H200",
	0x233b: "NVIDIA H200 NVL",
	0x2901: "NVIDIA B200",
	0x27b8: "NVIDIA L4",
	0x26b9: "NVIDIA L40S",
	0x1eb8: "Tesla T4",
	0x1db1: "Tesla V100-SXM2-16GB",
	0x1db5: "Tesla V100-SXM2-32GB",
	0x1db4: "Tesla V100-PCIE-16GB",
	0x1db6: "Tesla V100-PCIE-32GB",
	0x1df6: "Tesla V100S-PCIE-32GB",
}

// PCIProduct names a GPU by its PCI device ID; "" when the ID is not in the
// table.
func PCIProduct(deviceID uint16) string { return pciProducts[deviceID] }

// pciAddress is a PCI device's sysfs name: domain:bus:device.function.
var pciAddress = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// ReadPCI lists the NVIDIA GPUs under sysfsRoot/bus/pci/devices (sysfsRoot
// is /sys on a node), sorted by bus ID, at most MaxPCIDevices. It needs no
// driver. A device directory whose files cannot be read or parsed is left
// out and named in the returned error, next to the GPUs that could be read;
// a missing devices directory is an error with no GPUs.
func ReadPCI(sysfsRoot string) ([]gpuv1alpha1.PCIDevice, error) {
	dir := filepath.Join(sysfsRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading PCI devices: %w", err)
	}
	var devs []gpuv1alpha1.PCIDevice
	var errs []error
	for _, e := range entries {
		d, ok, err := readPCIDeviceDir(filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			devs = append(devs, d)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].BusID < devs[j].BusID })
	if len(devs) > MaxPCIDevices {
		errs = append(errs, fmt.Errorf("%d NVIDIA GPUs on the PCI bus; listing the first %d", len(devs), MaxPCIDevices))
		devs = devs[:MaxPCIDevices]
	}
	return devs, errors.Join(errs...)
}

func readPCIDeviceDir(path, busID string) (gpuv1alpha1.PCIDevice, bool, error) {
	vendor, err := os.ReadFile(filepath.Join(path, "vendor"))
	if err != nil {
		return gpuv1alpha1.PCIDevice{}, false, fmt.Errorf("PCI device %s: %w", busID, err)
	}
	if v, err := parseHex(vendor, 16); err != nil || v != PCIVendorNVIDIA {
		// Another vendor's device (or one whose vendor cannot be read,
		// which no GPU of ours is): none of our business.
		return gpuv1alpha1.PCIDevice{}, false, nil
	}
	device, err := os.ReadFile(filepath.Join(path, "device"))
	if err != nil {
		return gpuv1alpha1.PCIDevice{}, false, fmt.Errorf("PCI device %s: %w", busID, err)
	}
	class, err := os.ReadFile(filepath.Join(path, "class"))
	if err != nil {
		return gpuv1alpha1.PCIDevice{}, false, fmt.Errorf("PCI device %s: %w", busID, err)
	}
	return ParsePCIDevice(busID, vendor, device, class)
}

// ParsePCIDevice parses one sysfs PCI device directory's name and its
// vendor, device and class files ("0x10de\n", "0x2330\n", "0x030200\n").
// ok is false for anything that is not an NVIDIA GPU (another vendor, the
// card's audio or USB function); err is set when the files are malformed.
func ParsePCIDevice(busID string, vendor, device, class []byte) (d gpuv1alpha1.PCIDevice, ok bool, err error) {
	if !pciAddress.MatchString(busID) {
		return d, false, fmt.Errorf("PCI device %q: not a PCI address", busID)
	}
	v, err := parseHex(vendor, 16)
	if err != nil {
		return d, false, fmt.Errorf("PCI device %s: vendor: %w", busID, err)
	}
	if v != PCIVendorNVIDIA {
		return d, false, nil
	}
	id, err := parseHex(device, 16)
	if err != nil {
		return d, false, fmt.Errorf("PCI device %s: device: %w", busID, err)
	}
	c, err := parseHex(class, 24)
	if err != nil {
		return d, false, fmt.Errorf("PCI device %s: class: %w", busID, err)
	}
	if base := c >> 8; base != pciClassVGA && base != pciClass3D {
		return d, false, nil
	}
	return gpuv1alpha1.PCIDevice{BusID: busID, DeviceID: fmt.Sprintf("0x%04x", id), Class: fmt.Sprintf("0x%06x", c),
		Product: PCIProduct(uint16(id))}, true, nil
}

// parseHex parses a sysfs hex attribute: "0x" and hex digits, an optional
// trailing newline, at most bits wide.
func parseHex(b []byte, bits int) (uint64, error) {
	s := strings.TrimSuffix(string(b), "\n")
	digits, found := strings.CutPrefix(s, "0x")
	if !found || digits == "" || len(digits) > bits/4 {
		return 0, fmt.Errorf("%q is not a %d-bit hex value", s, bits)
	}
	v, err := strconv.ParseUint(digits, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%q is not a %d-bit hex value", s, bits)
	}
	return v, nil
}

// WritePCITree writes devs as a sysfs tree under root (root/bus/pci/devices/
// <bus ID>/{vendor,device,class}), as the kernel shows them: the simulator's
// PCI bus, and tests'. A device without a class is a 3D controller.
func WritePCITree(root string, devs []gpuv1alpha1.PCIDevice) error {
	// The bus exists with no GPU on it too (a node whose GPUs are gone).
	if err := os.MkdirAll(filepath.Join(root, "bus", "pci", "devices"), 0o755); err != nil {
		return err
	}
	for _, d := range devs {
		dir := filepath.Join(root, "bus", "pci", "devices", d.BusID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		class := d.Class
		if class == "" {
			class = "0x030200"
		}
		for name, val := range map[string]string{"vendor": fmt.Sprintf("0x%04x", PCIVendorNVIDIA), "device": d.DeviceID, "class": class} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(val+"\n"), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
