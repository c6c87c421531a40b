package mapping

import (
	"regexp"
	"slices"
)

// Framework is a key shape that only one framework's own saves have, with
// the built-in mappings for that framework. Keys of that shape that no
// mapping applies to are a model the built-ins do not cover (MoE, MLA, a
// renamed module), which a view says rather than showing names silently.
type Framework struct {
	Name  string
	Keys  *regexp.Regexp // matches some key of every checkpoint it saves
	Specs []string       // its built-in mappings, by name
}

// Frameworks are the frameworks whose keys the built-in mappings rename.
var Frameworks = []Framework{
	{"Megatron-Core", regexp.MustCompile(`^decoder\.`), []string{"megatron-gpt"}},
	{"torchtitan", regexp.MustCompile(`^layers\.[0-9]+\.attention\.`),
		[]string{"torchtitan-llama", "torchtitan-qwen3", "kempnerforge-llama"}},
	{"OLMo-core", regexp.MustCompile(`^blocks\.[0-9]+\.(attention|feed_forward)\.`), []string{"olmo-core-olmo2"}},
}

// FrameworkOf is the framework some source's name looks like, or nil.
func FrameworkOf(sources []Source) *Framework {
	for i, fw := range Frameworks {
		for _, s := range sources {
			if fw.Keys.MatchString(s.Name) {
				return &Frameworks[i]
			}
		}
	}
	return nil
}

// Coverage returns the sources no rule of s takes, by the names its rules
// read (with every index placeholder, as applying it matches them), and
// the first name of each required rule that no source matches.
func (s *Spec) Coverage(sources []Source) (uncovered, missing []string) {
	covered := make([]bool, len(sources))
	for _, r := range s.Rules {
		found := false
		for _, from := range r.From {
			re := nameTemplate(from)
			for i, src := range sources {
				if re != nil && re.MatchString(src.Name) || re == nil && src.Name == from {
					covered[i], found = true, true
				}
			}
		}
		if !found && !r.Optional && !r.UnlessTied && len(r.From) > 0 && !slices.Contains(missing, r.From[0]) {
			missing = append(missing, r.From[0])
		}
	}
	for i, src := range sources {
		if !covered[i] {
			uncovered = append(uncovered, src.Name)
		}
	}
	return uncovered, missing
}
