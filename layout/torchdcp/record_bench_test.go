package torchdcp

import (
	"bytes"
	"os"
	"sync/atomic"
	"testing"
)

// BenchmarkLocateRecord locates chunks in records torch wrote: those of
// $CKPTFS_BENCH_RECORDS (a DCP checkpoint directory, as the W = 256
// real-bytes one of the scale section), else every fixture's. "memo" is as
// a view locates a tensor's chunks one after another (its data.pkl memo),
// "cold" decodes every data.pkl.
func BenchmarkLocateRecord(b *testing.B) {
	dirs := fixtureCheckpoints(b)
	if d := os.Getenv("CKPTFS_BENCH_RECORDS"); d != "" {
		dirs = []string{d}
	}
	var recs []realRecord
	for _, dir := range dirs {
		for _, r := range realRecords(b, dir) {
			if _, _, ok := dtypeOf(r.dtype); ok {
				recs = append(recs, r)
			}
		}
	}
	for _, how := range []string{"memo", "cold"} {
		b.Run(how, func(b *testing.B) {
			var memo atomic.Pointer[pklMemo]
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r := recs[i%len(recs)]
				_, es, _ := dtypeOf(r.dtype)
				m := &memo
				if how == "cold" {
					m = nil
				}
				if _, err := locateRecordMemo(bytes.NewReader(r.data), int64(len(r.data)), recordWant{DType: r.dtype, ElemSize: es, Sizes: r.shape}, m, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
