package inventory

import (
	"cmp"
	"math/bits"
	"slices"
	"sort"
)

// bucketKey is a set of nodes alike for packing: the placements that may
// use them (one bit each) and the units they have.
type bucketKey struct {
	mask uint64
	n    int64
}

// packBuckets places demands (largest first) onto nodes given as buckets
// of alike nodes, one pod at a time onto the node with the least units
// that holds it and that its placement may use (best fit; among equals,
// the node fewer placements may use). It works on a copy; the cost is
// O(pods × buckets), independent of the number of nodes.
func packBuckets(demands []demand, hist map[bucketKey]int64) bool {
	h := make(map[bucketKey]int64, len(hist))
	keys := make([]bucketKey, 0, len(hist))
	for k, v := range hist {
		if v > 0 && k.n > 0 {
			h[k] = v
			keys = append(keys, k)
		}
	}
	less := func(a, b bucketKey) int {
		if a.n != b.n {
			return cmp.Compare(a.n, b.n)
		}
		if d := bits.OnesCount64(a.mask) - bits.OnesCount64(b.mask); d != 0 {
			return d
		}
		return cmp.Compare(a.mask, b.mask)
	}
	slices.SortFunc(keys, less)
	for _, d := range demands {
		bit := uint64(1) << d.place
		for range d.Count {
			i := sort.Search(len(keys), func(i int) bool { return keys[i].n >= d.GPUs })
			for i < len(keys) && keys[i].mask&bit == 0 {
				i++
			}
			if i == len(keys) {
				return false
			}
			k := keys[i]
			if h[k]--; h[k] == 0 {
				delete(h, k)
				keys = slices.Delete(keys, i, i+1)
			}
			if rest := (bucketKey{k.mask, k.n - d.GPUs}); rest.n > 0 {
				if h[rest] == 0 {
					j, _ := slices.BinarySearchFunc(keys, rest, less)
					keys = slices.Insert(keys, j, rest)
				}
				h[rest]++
			}
		}
	}
	return true
}

// pack is packBuckets for groups that may all use every node, given as a
// histogram units → nodes.
func pack(groups []PodGroup, hist map[int64]int64) bool {
	h := make(map[bucketKey]int64, len(hist))
	for k, v := range hist {
		h[bucketKey{1, k}] = v
	}
	demands := make([]demand, len(groups))
	for i, g := range groups {
		demands[i] = demand{PodGroup: g}
	}
	return packBuckets(demands, h)
}
