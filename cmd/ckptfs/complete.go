package main

import (
	"github.com/spf13/cobra"

	"github.com/ckptfs/ckptfs/layout/mapping"
)

// completeValues completes the values of the flags that take one of a few
// words, in every command that has them (shell completion: ckptfs
// completion bash|zsh|fish).
func completeValues(root *cobra.Command) {
	var maps []string
	for _, s := range mapping.Builtin {
		maps = append(maps, s.Name)
	}
	words := map[string]cobra.CompletionFunc{
		"dtype":     cobra.FixedCompletions([]string{"bf16", "fp16", "fp32"}, cobra.ShellCompDirectiveNoFileComp),
		"log-level": cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp),
		// A built-in mapping, or a mapping file.
		"map": cobra.FixedCompletions(append([]string{"auto", "none"}, maps...), cobra.ShellCompDirectiveDefault),
	}
	for _, cmd := range root.Commands() {
		for name, fn := range words {
			if cmd.Flags().Lookup(name) != nil {
				cmd.RegisterFlagCompletionFunc(name, fn)
			}
		}
	}
}
