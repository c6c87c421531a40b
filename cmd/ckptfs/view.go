package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ckptfs/ckptfs/layout"
)

// viewFlags are the flags that shape a view, shared by mount, inspect and export.
type viewFlags struct {
	sel          string
	maxShardSize byteSize
	hfConfig     string
}

// selectHelp is the help of --select, shared by every command.
const selectHelp = "which tensors to show: KEY shows the subtree saved under KEY (e.g. model) without its prefix; " +
	"'.' shows every tensor, optimizer state included, under its saved name; " +
	"default: the \"model\" subtree when the state was saved nested as {\"model\": ..., \"optimizer\": ...}, " +
	"else every tensor but optimizer state, under its saved name"

func (v *viewFlags) register(fs *flag.FlagSet) {
	v.maxShardSize = layout.DefaultMaxShardSize
	fs.StringVar(&v.sel, "select", "", selectHelp)
	fs.Var(&v.maxShardSize, "max-shard-size", "split view files at this many bytes of tensor data (e.g. 5GB, 500MB)")
	fs.StringVar(&v.hfConfig, "hf-config", "", "directory with config.json/tokenizer files to show when the checkpoint has none")
}

func (v *viewFlags) options() layout.PlanOptions {
	return layout.PlanOptions{Select: v.sel, MaxShardSize: int64(v.maxShardSize), HFConfigDir: v.hfConfig}
}

// byteSize is a flag value like "5GB", "512MiB" or "1048576".
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseByteSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	u := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, unit := range units {
		if strings.HasSuffix(u, unit.suffix) {
			u, mult = strings.TrimSpace(strings.TrimSuffix(u, unit.suffix)), unit.mult
			break
		}
	}
	f, err := strconv.ParseFloat(u, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 5GB, 512MiB, 1048576)", s)
	}
	return int64(f * float64(mult)), nil
}

// openView opens the checkpoint in src, confined to root (src itself when
// root is ""), and plans its view.
func openView(src, root string, vf viewFlags) (*layout.Checkpoint, *layout.View, error) {
	c, err := openCheckpoint(src, root)
	if err != nil {
		return nil, nil, err
	}
	v, err := layout.Plan(c, vf.options())
	if err != nil {
		return c, nil, err
	}
	return c, v, nil
}

// closeView releases what openView opened.
func closeView(c *layout.Checkpoint, v *layout.View) {
	if v != nil {
		v.Close()
	} else if c != nil {
		c.Close()
	}
}

// openCheckpoint opens src as a tree of its own, or as a directory of the
// wider tree root (an HF hub cache, whose snapshots link into ../../blobs).
func openCheckpoint(src, root string) (*layout.Checkpoint, error) {
	if root == "" {
		return layout.Open(src)
	}
	rel, err := filepath.Rel(root, src)
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		return nil, fmt.Errorf("%s is not inside --root %s", src, root)
	}
	return layout.OpenIn(root, filepath.ToSlash(rel))
}

const rootHelp = "read nothing outside this directory (default: SRC itself); symlinks in SRC may point anywhere inside it, e.g. an HF hub cache whose snapshots/ link into blobs/"

func runInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", "SRC", "Show the format, tensors (dtype, shape, chunks, sharded dims), non-tensor items and the planned HF view of the checkpoint in SRC.", stderr)
	var vf viewFlags
	vf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	root := fs.String("root", "", rootHelp)
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	c, v, planErr := openView(pos[0], *root, vf)
	if c == nil {
		return planErr
	}
	defer closeView(c, v)
	report := layout.NewReport(c, v)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			return err
		}
		return planErr
	}
	printReport(stdout, report)
	return planErr
}

func printReport(w io.Writer, r layout.Report) {
	fmt.Fprintf(w, "%s: %s, %d tensors, %d in view, %d left out\n\n", r.Dir, r.Format, len(r.Tensors), r.Selected, len(r.Omitted))
	if r.Note != "" {
		fmt.Fprintf(w, "%s\n\n", r.Note)
	}
	why := map[string]string{}
	for _, o := range r.Omitted {
		why[o.Name] = o.Reason
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENSOR\tDTYPE\tSHAPE\tCHUNKS\tSHARDED DIMS\tBYTES\tVIEW")
	for _, t := range r.Tensors {
		view := "-"
		if reason, ok := why[t.Name]; ok {
			view = "left out: " + reason
		}
		if t.ViewFile != "" {
			view = t.ViewFile
			if t.ViewName != t.Name {
				view += ":" + t.ViewName
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%v\t%s\t%s\n", t.Name, t.DType, t.Shape, t.Chunks, t.ShardedDims, human(t.Bytes), view)
	}
	tw.Flush()
	if len(r.Objects) > 0 {
		fmt.Fprintf(w, "\nNon-tensor items (not in the view):\n")
		for _, o := range r.Objects {
			fmt.Fprintf(w, "  %s (%s)\n", o.Name, human(o.Size))
		}
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "\nSkipped tensors:\n")
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "  %s: %s\n", s.Name, s.Reason)
		}
	}
	if len(r.Files) > 0 {
		fmt.Fprintf(w, "\nView files:\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, f := range r.Files {
			extra := ""
			if f.Tensors > 0 {
				extra = fmt.Sprintf("%d tensors", f.Tensors)
			} else if f.Source != "" {
				extra = "from " + f.Source
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Name, human(f.Size), extra)
		}
		tw.Flush()
	}
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("export", "SRC OUT", "Write the HF view of the checkpoint in SRC to the new directory OUT, streaming, without FUSE.\nOUT appears only when complete (written to a temporary directory, then renamed).", stderr)
	var vf viewFlags
	vf.register(fs)
	quiet := fs.Bool("quiet", false, "no progress bar")
	workers := fs.Int("workers", 4, "blocks read in parallel")
	root := fs.String("root", "", rootHelp)
	pos, err := parse(fs, args, 2)
	if err != nil {
		return err
	}
	c, v, err := openView(pos[0], *root, vf)
	defer closeView(c, v)
	if err != nil {
		return err
	}
	if v.Note != "" {
		return errors.New(v.Note)
	}
	opts := layout.ExportOptions{Workers: *workers}
	var bar *progressBar
	if !*quiet && isTerminal(stderr) {
		bar = newProgressBar(stderr, v.TotalSize())
		opts.Progress = bar.update
	}
	start := time.Now()
	err = layout.Export(v, pos[1], opts)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	if !*quiet {
		secs := time.Since(start).Seconds()
		fmt.Fprintf(stderr, "exported %d tensors, %s in %d files to %s (%.1f MB/s)\n",
			len(v.Tensors), human(v.TotalSize()), len(v.Files), pos[1], float64(v.TotalSize())/1e6/max(secs, 1e-9))
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar draws a one-line bar, redrawn at most every 100 ms.
type progressBar struct {
	w     io.Writer
	total int64
	start time.Time
	last  time.Time
}

func newProgressBar(w io.Writer, total int64) *progressBar {
	return &progressBar{w: w, total: total, start: time.Now()}
}

func (p *progressBar) update(done, total int64) {
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = now
	frac := float64(done) / float64(max(total, 1))
	const width = 30
	filled := int(frac * width)
	rate := float64(done) / 1e6 / max(now.Sub(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r[%s%s] %5.1f%% %s / %s %.0f MB/s ", strings.Repeat("=", filled), strings.Repeat(" ", width-filled),
		frac*100, human(done), human(total), rate)
}

func (p *progressBar) finish() { fmt.Fprintf(p.w, "\n") }
