package framework

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// copyChunk is the size of FreshCopy's writes: io.Copy's, which containerd
// unpacks image layers with.
const copyChunk = 32 << 10

// FreshCopy copies the executable src into dir in 32 KiB writes, as
// containerd unpacks an image layer (io.Copy), and returns the copy's path.
// Benchmarks run every contender from such a copy, so that their binaries'
// pages sit in the page cache alike. The page cache keeps a file in folios
// as large as the writes that made it (ext4 on Linux 6.18), and a page
// fault maps the whole folio: a binary the Go linker has just written, or
// one copied in 1 MiB writes, then shows up to twice the file-backed RSS of
// the same binary unpacked from an image. Measured here: touching one byte
// every 4 MiB of the manager's binary maps 30 MiB of the linker's output,
// 24 MiB of a copy in 1 MiB writes, 3 MiB of a copy in 64 KiB writes.
func FreshCopy(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	dst := filepath.Join(dir, filepath.Base(src))
	tmp := dst + ".copy"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return "", err
	}
	// Plain reads and writes (no copy_file_range, which would let the
	// kernel choose), each of copyChunk.
	if _, err := io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, make([]byte, copyChunk)); err != nil {
		out.Close()
		return "", fmt.Errorf("copying %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp, dst)
}
