package s3_test

import (
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestMain stops the moto server that the package's tests share.
func TestMain(m *testing.M) { objstoretest.Main(m) }
