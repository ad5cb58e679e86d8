package manager

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

// --kueue-label-keys-to-copy takes a comma list of label keys, as Kueue's
// integrations.labelKeysToCopy, and refuses a key that is not one.
func TestKueueLabelKeysToCopyFlag(t *testing.T) {
	tests := []struct {
		arg     string
		want    []string
		wantErr bool
	}{
		{"team", []string{"team"}, false},
		{" team , example.com/cost-center ,", []string{"team", "example.com/cost-center"}, false},
		{"", nil, false},
		{"team,bad key", nil, true},
		{"-team", nil, true},
	}
	for _, tt := range tests {
		o := DefaultOptions()
		fs := flag.NewFlagSet("loom", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		err := fs.Parse([]string{"--kueue-label-keys-to-copy=" + tt.arg})
		if (err != nil) != tt.wantErr {
			t.Errorf("%q: error %v, want one: %v", tt.arg, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !reflect.DeepEqual(o.KueueLabelKeysToCopy, tt.want) {
			t.Errorf("%q: keys %q, want %q", tt.arg, o.KueueLabelKeysToCopy, tt.want)
		}
	}
}
