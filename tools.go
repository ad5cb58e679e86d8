//go:build tools

// Package tools pins modules the product depends on before any package
// imports them (go mod tidy keeps these requirements).
package tools

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
)
