package testenv

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ReadCounter is a reader that notes every read made through it (get,
// list) before passing it on: a test of what a reconciler reads around
// its cache asks it how many there were.
type ReadCounter struct {
	client.Reader
	mu    sync.Mutex
	reads []string
}

// CountReads wraps r.
func CountReads(r client.Reader) *ReadCounter { return &ReadCounter{Reader: r} }

// Reads are the reads made so far, as "verb type namespace/name" (a list:
// "list type").
func (c *ReadCounter) Reads() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.reads...)
}

func (c *ReadCounter) note(read string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads = append(c.reads, read)
}

func (c *ReadCounter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.note(fmt.Sprintf("get %s %s", kindOf(obj), key))
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c *ReadCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.note(fmt.Sprintf("list %s", kindOf(list)))
	return c.Reader.List(ctx, list, opts...)
}

// kindOf is obj's kind when it says it (an unstructured object), else its
// Go type.
func kindOf(obj interface{ GetObjectKind() schema.ObjectKind }) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return fmt.Sprintf("%T", obj)
}

// NoCopyLists is a reader that fails t on a List that asks the cache for
// deep copies (no client.UnsafeDisableDeepCopy): a metrics collector reads
// every cached object of a kind at each scrape, and copying them all once
// a scrape is garbage in proportion to the cluster.
type NoCopyLists struct {
	client.Reader
	T interface{ Errorf(string, ...any) }
}

// List passes the list on after checking it asks for no copies.
func (r NoCopyLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := &client.ListOptions{}
	lo.ApplyOptions(opts)
	if lo.UnsafeDisableDeepCopy == nil || !*lo.UnsafeDisableDeepCopy {
		r.T.Errorf("a %T list deep-copies every cached object: pass client.UnsafeDisableDeepCopy", list)
	}
	return r.Reader.List(ctx, list, opts...)
}
