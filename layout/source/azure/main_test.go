package azure_test

import (
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestMain stops the Azurite that the package's tests share.
func TestMain(m *testing.M) { objstoretest.Main(m) }
