package dcpwrite

import (
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/safetensors"
)

// TestTorchLoads writes every round-trip scenario, the golden checkpoint and
// a torch-written checkpoint extended by a commit, then has real torch
// check them with testdata/check_load.py: read_metadata, dcp.load into plain
// tensors, and dcp_to_torch_save.
func TestTorchLoads(t *testing.T) {
	py := testenv.Python(t, "torch.distributed.checkpoint")
	root := t.TempDir()
	var dirs []string
	for _, sc := range scenarios {
		dir := filepath.Join(root, sc.name)
		verifyDir(t, dir, sc.run(t, dir))
		dirs = append(dirs, dir)
	}

	dir := filepath.Join(root, "golden")
	verifyDir(t, dir, goldenCommit(t, dir))
	dirs = append(dirs, dir)

	// A torch checkpoint with nesting, int path elements (param_groups.0)
	// and BYTE_IO objects, extended by a commit.
	dir = filepath.Join(root, "extend-nested")
	copyDir(t, filepath.Join("..", "torchdcp", "testdata", "nested"), dir)
	target := Target{WorldSize: 3, Prefix: "model"}
	exps := commitAll(t, dir, target, makeST(t, 1, spec{"l2.weight", safetensors.BF16, []int64{5, 3}}))
	verifyDir(t, dir, exps)
	writeExpect(t, dir, exps, [][]any{
		{"model", "l1.weight"}, {"optimizer", "param_groups", 0, "lr"},
		{"optimizer", "state", "l1.weight", "exp_avg"}, {"extra"},
	})
	dirs = append(dirs, dir)

	cmd := exec.Command(py, append([]string{filepath.Join("testdata", "check_load.py")}, dirs...)...)
	out, err := cmd.CombinedOutput()
	t.Logf("check_load.py:\n%s", out)
	require.NoError(t, err, "torch rejected a checkpoint:\n%s", out)

	// Resharded loads: 2 gloo ranks, DTensor Shard(0)/Shard(1)/Replicate.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	args := []string{filepath.Join("testdata", "check_reshard.py"), "2", strconv.Itoa(port)}
	for _, d := range dirs {
		if filepath.Base(d) != "extend-nested" { // its torch-written part is not ours to check
			args = append(args, d)
		}
	}
	out, err = exec.Command(py, args...).CombinedOutput()
	t.Logf("check_reshard.py:\n%s", out)
	require.NoError(t, err, "torch failed a resharded load:\n%s", out)
}
