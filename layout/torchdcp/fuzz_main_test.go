package torchdcp

import (
	"flag"
	"os"
	"testing"
)

// fuzzMinimize caps the runs spent minimizing each new input the fuzzer
// finds, as make fuzz does (FUZZMINIMIZE). Go's minimizer tries removing
// every pair of cut points, O(n²) runs for an input of n bytes, and stops
// only at -fuzzminimizetime (60 s by default): every input grown from a
// .metadata of kilobytes took the whole minute, so a plain
// `go test -fuzz FuzzDecodeMetadataStream` ran about one input per second
// (BENCHMARKS.md, run Z-scale).
const fuzzMinimize = "200x"

// TestMain sets -test.fuzzminimizetime to fuzzMinimize unless the command
// line gives it.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.fuzzminimizetime" })
	if !given {
		if err := flag.Set("test.fuzzminimizetime", fuzzMinimize); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
