package testenv

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WriteCounter is a client that notes every write made through it (create,
// update, patch, apply, delete, on objects and their subresources) before
// passing it on: a test of a fresh reconciler over a converged system asks
// it that there were none.
type WriteCounter struct {
	client.Client
	mu     sync.Mutex
	writes []string
}

// CountWrites wraps c.
func CountWrites(c client.Client) *WriteCounter { return &WriteCounter{Client: c} }

// Writes are the writes made so far, as "verb kind namespace/name".
func (c *WriteCounter) Writes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.writes...)
}

func (c *WriteCounter) note(verb string, obj any) {
	desc := fmt.Sprintf("%T", obj)
	if o, ok := obj.(client.Object); ok {
		kind := o.GetObjectKind().GroupVersionKind().Kind
		if kind == "" {
			if gvk, err := c.GroupVersionKindFor(o); err == nil {
				kind = gvk.Kind
			}
		}
		desc = kind + " " + client.ObjectKeyFromObject(o).String()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, verb+" "+desc)
}

func (c *WriteCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.note("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *WriteCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.note("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *WriteCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.note("patch", obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *WriteCounter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.note("apply", obj)
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *WriteCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.note("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *WriteCounter) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	c.note("deleteall", obj)
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *WriteCounter) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *WriteCounter) SubResource(name string) client.SubResourceClient {
	return &subResourceCounter{SubResourceClient: c.Client.SubResource(name), c: c, name: name}
}

type subResourceCounter struct {
	client.SubResourceClient
	c    *WriteCounter
	name string
}

func (s *subResourceCounter) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	s.c.note("create "+s.name, obj)
	return s.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (s *subResourceCounter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.note("update "+s.name, obj)
	return s.SubResourceClient.Update(ctx, obj, opts...)
}

func (s *subResourceCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.note("patch "+s.name, obj)
	return s.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

func (s *subResourceCounter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	s.c.note("apply "+s.name, obj)
	return s.SubResourceClient.Apply(ctx, obj, opts...)
}
