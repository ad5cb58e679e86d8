// Package testenv runs Loom's integration tests against a real API server:
// etcd and kube-apiserver built from source (hack/tools), Loom's CRDs and the
// third-party CRDs its reconcilers use, and a real manager.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

const modulePath = "github.com/loom-dev/loom"

// RepoRoot finds the checkout's root by walking up from the working directory
// to the go.mod of Loom's module.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", modulePath)
		}
		dir = parent
	}
}

var toolDirs sync.Map // tool name -> directory

// ToolDir returns the cache directory holding a tool built by
// hack/tools/build.sh (kube, kwok, helm, controller-gen, golangci-lint,
// prometheus-operator, kueue), building it first if the cache lacks it. For "kube",
// a set KUBEBUILDER_ASSETS wins.
func ToolDir(tool string) (string, error) {
	if tool == "kube" {
		if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
			return dir, nil
		}
	}
	if dir, ok := toolDirs.Load(tool); ok {
		return dir.(string), nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "tools", "build.sh"), tool)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/tools/build.sh %s: %w\n%s", tool, err, stderr.String())
	}
	dir := strings.TrimSpace(stdout.String())
	toolDirs.Store(tool, dir)
	return dir, nil
}
