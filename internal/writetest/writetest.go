// Package writetest is what writer tests share: a directory opened for
// writing by its path, as the FUSE layer never opens one (it creates each
// directory through its parent's source.Dir).
package writetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/ckptfs/ckptfs/layout/source"
)

// MakeDir opens the directory path for writing, creating it (not its
// parents) if missing. A path naming a file is an error.
func MakeDir(path string) (*source.Dir, error) {
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("writetest: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("writetest: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("writetest: %s is not a directory", path)
	}
	root, err := source.OpenDir(path)
	if err != nil {
		return nil, fmt.Errorf("writetest: %w", err)
	}
	return root, nil
}
