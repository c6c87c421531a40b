package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
	"github.com/ckptfs/ckptfs/vfs/readpath"
)

// viewFlags are the flags that shape a view, shared by mount, inspect and export.
type viewFlags struct {
	sel          string
	maxShardSize *byteSize
	hfConfig     string
	dtype        dtypeFlag
	mapping      mapFlag
	verify       bool
}

// mapFlag is --map: none, a built-in mapping's name, or a mapping file.
type mapFlag struct {
	value string
	spec  *mapping.Spec
	none  bool
}

func (f *mapFlag) String() string { return f.value }
func (f *mapFlag) Type() string   { return "FILE" }

func (f *mapFlag) Set(s string) error {
	*f = mapFlag{value: s}
	switch {
	case s == "" || s == "auto":
	case s == "none":
		f.none = true
	case mapping.ByName(s) != nil:
		f.spec = mapping.ByName(s)
	default:
		spec, err := mapping.ReadFile(s)
		if err != nil {
			return err
		}
		f.spec = spec
	}
	return nil
}

// mapHelp lists the built-in mappings.
func mapHelp() string {
	var names []string
	for _, s := range mapping.Builtin {
		names = append(names, s.Name)
	}
	return "map tensors to HF names and layouts with this mapping file (see README), or a built-in one (" +
		strings.Join(names, ", ") + "), or none to show them as saved; default: the built-in mapping the checkpoint's keys match"
}

// dtypeFlag is --dtype: bf16, fp16 or fp32.
type dtypeFlag struct{ d safetensors.DType }

func (f *dtypeFlag) String() string { return strings.ToLower(string(f.d)) }
func (f *dtypeFlag) Type() string   { return "dtype" }

func (f *dtypeFlag) Set(s string) error {
	d, err := view.ParseDType(s)
	if err == nil {
		f.d = d
	}
	return err
}

// selectHelp is the help of --select, shared by every command.
const selectHelp = "tensors to show: the subtree saved under `KEY`, prefix removed; '.' for every tensor under its saved name " +
	"(optimizer state too); default: the \"model\" subtree if saved nested as {\"model\", \"optimizer\"}, else all but optimizer state"

func (v *viewFlags) register(fs *pflag.FlagSet) {
	v.maxShardSize = newByteSize(view.DefaultMaxShardSize, false)
	fs.StringVar(&v.sel, "select", "", selectHelp)
	fs.Var(v.maxShardSize, "max-shard-size", "split view files at this many bytes of tensor data (e.g. 5GB, 500MB)")
	fs.StringVar(&v.hfConfig, "hf-config", "", "`DIR` with config.json/tokenizer files to show when the checkpoint has none")
	fs.Var(&v.dtype, "dtype", "convert floating tensors on read to bf16, fp16 or fp32, rounding as torch's .to() (default: as saved)")
	fs.Var(&v.mapping, "map", mapHelp())
	fs.BoolVar(&v.verify, "verify", false, "check every chunk against its record's CRC32 before serving a byte of it (torch.save records; inspect checks them all)")
}

func (v *viewFlags) options() view.Options {
	return view.Options{Select: v.sel, MaxShardSize: v.maxShardSize.Int64(), HFConfigDir: v.hfConfig, DType: v.dtype.d,
		Mapping: v.mapping.spec, NoMapping: v.mapping.none, Verify: v.verify}
}

// openView opens the checkpoint in src (a local directory or an s3:// URL),
// confined to root (src itself when root is ""), and plans its view.
func openView(src, root string, vf viewFlags, sf *sourceFlags, policy readpath.Policy) (*layout.Checkpoint, *view.View, error) {
	if err := sf.check(src); err != nil {
		return nil, nil, err
	}
	o := sf.options(policy.Cache.BlockSize)
	o.SetAhead(policy.MinRequest, policy.AheadMemory)
	c, err := layout.OpenAtWith(context.Background(), src, root, o, view.OpenOptions(vf.options()))
	if err != nil {
		return nil, nil, err
	}
	v, err := view.Plan(c, vf.options())
	if err != nil {
		return c, nil, err
	}
	return c, v, nil
}

// exportPolicy is how inspect and export read src (readpath.For): the
// blocks export reads, on workers (0: the policy's), and an object's
// streams.
func exportPolicy(src string, workers int) readpath.Policy {
	return readpath.For(readpath.Source{Remote: open.IsRemote(src), Export: true, FetchAhead: true,
		Cache: cache.Options{Workers: workers}, WorkersGiven: workers > 0})
}

// closeView releases what openView opened.
func closeView(c *layout.Checkpoint, v *view.View) {
	if v != nil {
		v.Close()
	} else if c != nil {
		c.Close()
	}
}

const rootHelp = "read nothing outside `DIR` (default: SRC itself); symlinks in SRC may point anywhere inside it, e.g. an HF hub cache whose snapshots/ link into blobs/ (for s3:// SRC, an s3:// prefix above it)"

func newInspectCmd() *cobra.Command {
	var vf viewFlags
	var sf sourceFlags
	var asJSON bool
	var root string
	cmd := &cobra.Command{
		Use:   "inspect [flags] SRC",
		Short: "Show what a checkpoint holds and the HF view planned from it",
		Long: "Show the format, tensors (dtype, shape, chunks, sharded dims), non-tensor items and the planned HF view of the checkpoint in SRC,\n" +
			"and every tensor the view leaves out, with the reason.",
		Args: positional("SRC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLimits(cmd.Flags()); err != nil {
				return err
			}
			return runInspect(cmd.OutOrStdout(), args[0], root, vf, &sf, asJSON)
		},
	}
	vf.register(cmd.Flags())
	sf.register(cmd.Flags(), false)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.Flags().StringVar(&root, "root", "", rootHelp)
	completeDirs(cmd, "hf-config", "root")
	cmd.ValidArgsFunction = dirArgs
	return cmd
}

func runInspect(stdout io.Writer, src, root string, vf viewFlags, sf *sourceFlags, asJSON bool) error {
	c, v, planErr := openView(src, root, vf, sf, exportPolicy(src, 0))
	if c == nil {
		return planErr
	}
	defer closeView(c, v)
	report := view.NewReport(c, v)
	if vf.verify && planErr == nil {
		checked, unchecked, err := ckpt.VerifyChunks(c)
		if err != nil {
			return err
		}
		report.Verified = fmt.Sprintf("%d chunks match their CRC32; %d have no checksum", checked, unchecked)
	}
	if asJSON {
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

func printReport(w io.Writer, r view.Report) {
	mapped := ""
	if r.Mapping != "" {
		mapped = ", mapped by " + r.Mapping
	}
	fmt.Fprintf(w, "%s: %s, %d tensors, %d in view%s, %d left out\n\n", r.Dir, r.Format, len(r.Tensors), r.Selected, mapped, len(r.Omitted)+len(r.Skipped))
	if r.Note != "" {
		fmt.Fprintf(w, "%s\n\n", r.Note)
	}
	if r.Verified != "" {
		fmt.Fprintf(w, "verified: %s\n\n", r.Verified)
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintln(w)
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
		if t.Mapped > 0 {
			view = fmt.Sprintf("mapped into %d", t.Mapped)
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
	if r.Mapping != "" {
		fmt.Fprintf(w, "\nView tensors (mapping %s):\n", r.Mapping)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tDTYPE\tSHAPE\tFILE\tFROM\tTRANSFORM")
		for _, t := range r.View {
			fmt.Fprintf(tw, "  %s\t%s\t%v\t%s\t%s\t%s\n", t.Name, t.DType, t.Shape, t.File, strings.Join(t.Sources, " + "), t.Transform)
		}
		tw.Flush()
	}
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

func newExportCmd() *cobra.Command {
	var vf viewFlags
	var sf sourceFlags
	var quiet bool
	var workers int
	var root string
	cmd := &cobra.Command{
		Use:   "export [flags] SRC OUT",
		Short: "Write the HF view of a checkpoint to a directory (no FUSE needed)",
		Long: `Write the HF view of the checkpoint in SRC to the new directory OUT, streaming, without FUSE.
OUT appears only when complete (written to a temporary directory, then renamed).`,
		Args: positional("SRC", "OUT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLimits(cmd.Flags()); err != nil {
				return err
			}
			if !cmd.Flags().Changed("workers") {
				workers = 0 // the policy's
			}
			return runExport(cmd.ErrOrStderr(), args[0], root, args[1], vf, &sf, quiet, workers)
		},
	}
	vf.register(cmd.Flags())
	sf.register(cmd.Flags(), true)
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	cmd.Flags().IntVar(&workers, "workers", 4, "blocks read in parallel (object store sources: 4 a core, 8 to 32)")
	cmd.Flags().StringVar(&root, "root", "", rootHelp)
	completeDirs(cmd, "hf-config", "root")
	cmd.ValidArgsFunction = dirArgs
	return cmd
}

func runExport(stderr io.Writer, src, root, out string, vf viewFlags, sf *sourceFlags, quiet bool, workers int) error {
	policy := exportPolicy(src, workers)
	c, v, err := openView(src, root, vf, sf, policy)
	defer closeView(c, v)
	if err != nil {
		return err
	}
	if v.Note != "" {
		return errors.New(v.Note)
	}
	opts := export.Options{Workers: policy.Cache.Workers, BlockSize: policy.Cache.BlockSize}
	var bar *progressBar
	if !quiet && isTerminal(stderr) {
		bar = newProgressBar(stderr, v.TotalSize())
		opts.Progress = bar.update
	}
	start := time.Now()
	// Ctrl-C or SIGTERM cancels the export, which removes its temporary
	// directory.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = export.Write(ctx, v, out, opts)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	if !quiet {
		secs := time.Since(start).Seconds()
		fmt.Fprintf(stderr, "exported %d tensors, %s in %d files to %s (%.1f MB/s)\n",
			len(v.Tensors), human(v.TotalSize()), len(v.Files), out, float64(v.TotalSize())/1e6/max(secs, 1e-9))
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
