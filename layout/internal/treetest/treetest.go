// Package treetest has test helpers for code that reads a source tree.
package treetest

import (
	"testing"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// Detect runs a format's Detect on the local directory dir.
func Detect(t testing.TB, r ckpt.Reader, dir string) bool {
	t.Helper()
	tree, err := source.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	return r.Detect(tree)
}
