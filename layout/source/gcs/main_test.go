package gcs_test

import (
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestMain stops the fake-gcs-server that the package's tests share.
func TestMain(m *testing.M) { objstoretest.Main(m) }
