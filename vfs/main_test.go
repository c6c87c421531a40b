package vfs

import (
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestMain stops the S3 server (moto) that the package's tests share.
func TestMain(m *testing.M) { objstoretest.Main(m) }
