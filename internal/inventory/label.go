package inventory

import (
	"regexp"
	"strings"
)

var invalidLabelChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// LabelValue makes s a valid label value the way GPU feature discovery does
// for product names: spaces (and anything else not allowed) become '-', at
// most 63 characters, starting and ending alphanumeric. The index keys
// products this way, so "NVIDIA H100 80GB HBM3" from NVML and the
// nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 a user selects are one.
func LabelValue(s string) string {
	s = invalidLabelChars.ReplaceAllString(strings.TrimSpace(s), "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.TrimFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	})
}

// ProductLabel is the node label (from GPU feature discovery) that names a
// node's GPU product; workloads select a product with it.
const ProductLabel = "nvidia.com/gpu.product"
