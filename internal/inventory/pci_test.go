package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// writeDev writes one sysfs device directory; an empty value leaves that
// file out.
func writeDev(t *testing.T, root, busID, vendor, device, class string) {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", busID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, val := range map[string]string{"vendor": vendor, "device": device, "class": class} {
		if val == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadPCI(t *testing.T) {
	type dev struct{ bus, vendor, device, class string }
	tests := []struct {
		name    string
		devs    []dev
		want    []string // busID/deviceID/class/product
		wantErr string
	}{
		{name: "two H100s, their audio function, a NIC and a host bridge",
			devs: []dev{
				{"0000:18:00.0", "0x10de\n", "0x2330\n", "0x030200\n"},
				{"0000:18:00.1", "0x10de\n", "0x22a3\n", "0x040300\n"}, // audio
				{"0000:18:00.2", "0x10de\n", "0x1ad8\n", "0x0c0330\n"}, // USB
				{"0000:0a:00.0", "0x10de\n", "0x2330\n", "0x030200\n"},
				{"0000:3b:00.0", "0x15b3\n", "0x1021\n", "0x020700\n"}, // ConnectX
				{"0000:00:00.0", "0x8086\n", "0x09a2\n", "0x060000\n"},
			},
			want: []string{"0000:0a:00.0/0x2330/0x030200/NVIDIA H100 80GB HBM3", "0000:18:00.0/0x2330/0x030200/NVIDIA H100 80GB HBM3"}},
		{name: "VGA-class GPU, unknown device ID",
			devs: []dev{{"0000:01:00.0", "0x10de\n", "0x1234\n", "0x030000\n"}},
			want: []string{"0000:01:00.0/0x1234/0x030000/"}},
		{name: "no newline, every table entry family",
			devs: []dev{{"0000:01:00.0", "0x10de", "0x2335", "0x030200"}, {"0000:02:00.0", "0x10de", "0x27b8", "0x030200"}},
			want: []string{"0000:01:00.0/0x2335/0x030200/NVIDIA H200", "0000:02:00.0/0x27b8/0x030200/NVIDIA L4"}},
		{name: "malformed device file is skipped and named",
			devs:    []dev{{"0000:01:00.0", "0x10de\n", "garbage\n", "0x030200\n"}, {"0000:02:00.0", "0x10de\n", "0x20b0\n", "0x030200\n"}},
			want:    []string{"0000:02:00.0/0x20b0/0x030200/NVIDIA A100-SXM4-40GB"},
			wantErr: `PCI device 0000:01:00.0: device: "garbage"`},
		{name: "missing class file",
			devs:    []dev{{"0000:01:00.0", "0x10de\n", "0x20b0\n", ""}},
			wantErr: "PCI device 0000:01:00.0",
		},
		{name: "class too wide",
			devs:    []dev{{"0000:01:00.0", "0x10de\n", "0x20b0\n", "0x03020000\n"}},
			wantErr: "class",
		},
		{name: "another vendor's unreadable files are not our business",
			devs: []dev{{"0000:01:00.0", "0x8086\n", "", ""}, {"0000:02:00.0", "\x00\x01", "", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "bus", "pci", "devices"), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, d := range tt.devs {
				writeDev(t, root, d.bus, d.vendor, d.device, d.class)
			}
			devs, err := ReadPCI(root)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error = %v, want %q", err, tt.wantErr)
			}
			var got []string
			for _, d := range devs {
				got = append(got, fmt.Sprintf("%s/%s/%s/%s", d.BusID, d.DeviceID, d.Class, d.Product))
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("devices = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReadPCIWithoutSysfs(t *testing.T) {
	devs, err := ReadPCI(filepath.Join(t.TempDir(), "nothing"))
	if err == nil || devs != nil {
		t.Fatalf("ReadPCI of a missing tree = %v, %v", devs, err)
	}
}

func TestWritePCITreeRoundTrips(t *testing.T) {
	root := t.TempDir()
	in := []gpuv1alpha1.PCIDevice{{BusID: "0000:01:00.0", DeviceID: "0x20b2"}, {BusID: "0000:02:00.0", DeviceID: "0x2901", Class: "0x030000"}}
	if err := WritePCITree(root, in); err != nil {
		t.Fatal(err)
	}
	devs, err := ReadPCI(root)
	if err != nil || len(devs) != 2 || devs[0].Class != "0x030200" || devs[0].Product != "NVIDIA A100-SXM4-80GB" ||
		devs[1].Class != "0x030000" || devs[1].Product != "NVIDIA B200" {
		t.Fatalf("read back %+v, %v", devs, err)
	}
}

func TestReadPCICapsTheList(t *testing.T) {
	root := t.TempDir()
	var in []gpuv1alpha1.PCIDevice
	for i := range MaxPCIDevices + 2 {
		in = append(in, gpuv1alpha1.PCIDevice{BusID: fmt.Sprintf("0000:%02x:00.0", i), DeviceID: "0x2330"})
	}
	if err := WritePCITree(root, in); err != nil {
		t.Fatal(err)
	}
	devs, err := ReadPCI(root)
	if len(devs) != MaxPCIDevices || err == nil {
		t.Fatalf("%d devices, %v", len(devs), err)
	}
}

func FuzzParsePCIDevice(f *testing.F) {
	f.Add("0000:18:00.0", "0x10de\n", "0x2330\n", "0x030200\n")
	f.Add("0000:18:00.1", "0x10de\n", "0x22a3\n", "0x040300\n")
	f.Add("0000:00:00.0", "0x8086", "0x09a2", "0x060000")
	f.Add("bogus", "10de", "0x", "0x0302000000")
	f.Fuzz(func(t *testing.T, busID, vendor, device, class string) {
		d, ok, err := ParsePCIDevice(busID, []byte(vendor), []byte(device), []byte(class))
		if ok && err != nil {
			t.Fatalf("ok with an error: %v", err)
		}
		if !ok {
			if d != (gpuv1alpha1.PCIDevice{}) {
				t.Fatalf("not a GPU but returned %+v", d)
			}
			return
		}
		if d.BusID != busID || len(d.DeviceID) != 6 || len(d.Class) != 8 ||
			!strings.HasPrefix(d.Class, "0x0300") && !strings.HasPrefix(d.Class, "0x0302") {
			t.Fatalf("GPU %+v from %q %q %q %q", d, busID, vendor, device, class)
		}
		// What it returns reads back the same.
		again, ok, err := ParsePCIDevice(d.BusID, []byte("0x10de\n"), []byte(d.DeviceID+"\n"), []byte(d.Class+"\n"))
		if !ok || err != nil || again != d {
			t.Fatalf("%+v does not round-trip: %+v %v %v", d, again, ok, err)
		}
	})
}
