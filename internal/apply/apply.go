// Package apply is the one way Loom's reconcilers write: their children
// (Writer.Ensure, Writer.Remove) and their status (Writer.Status), by
// server-side apply under a field owner per reconciler, deciding from the
// cache whether a write is needed at all, so a steady cluster costs none.
package apply

import (
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// ToUnstructured converts a typed object into an apply configuration,
// dropping what an apply must not claim: status and empty creation
// timestamps (of the object and of a pod template).
func ToUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	delete(m, "status")
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	return u, nil
}

// Each runs f on every item, at most limit at a time (the client's rate
// limiter is the real bound), and returns the errors joined.
func Each[T any](items []T, limit int, f func(T) error) error {
	if len(items) == 0 {
		return nil
	}
	sem := make(chan struct{}, max(limit, 1))
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(it); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
