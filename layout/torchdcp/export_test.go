package torchdcp

import "testing"

// SetMemRecordLimit and SetRecordBudget set memRecordLimit and
// recordBudget for the rest of a test of package torchdcp_test (which
// dcptest's checkpoints are for: it imports torchdcp).
func SetMemRecordLimit(t testing.TB, n int64) {
	old := memRecordLimit
	memRecordLimit = n
	t.Cleanup(func() { memRecordLimit = old })
}

func SetRecordBudget(t testing.TB, n int64) {
	old := recordBudget
	recordBudget = n
	t.Cleanup(func() { recordBudget = old })
}
