// Command promcheck parses Prometheus rule files and PromQL expressions with Prometheus' own
// parsers (model/rulefmt, strict: unknown fields are errors, and every expr and template is
// parsed too; promql/parser) and prints every metric name they select, one per line, sorted.
//
//	promcheck rules FILE...   rule files (`groups:`), as Prometheus loads them
//	promcheck exprs           PromQL expressions on stdin, one per line (blank lines skipped)
//
// Any parse error, or a selector that names no metric, exits non-zero with the error on stderr.
package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "rules" && os.Args[1] != "exprs") ||
		(os.Args[1] == "rules" && len(os.Args) < 3) {
		fmt.Fprintln(os.Stderr, "usage: promcheck rules FILE... | promcheck exprs < EXPRS")
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	names := map[string]bool{}
	failed := false
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		failed = true
	}
	collect := func(where, text string) {
		expr, err := p.ParseExpr(text)
		if err != nil {
			fail("%s: %v", where, err)
			return
		}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if selector, ok := node.(*parser.VectorSelector); ok {
				if selector.Name == "" {
					fail("%s: %s names no metric", where, selector)
				} else {
					names[selector.Name] = true
				}
			}
			return nil
		})
	}
	if os.Args[1] == "rules" {
		logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
		for _, file := range os.Args[2:] {
			groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, p, logger)
			for _, err := range errs {
				fail("%v", err)
			}
			if groups == nil || len(errs) > 0 {
				continue
			}
			for _, group := range groups.Groups {
				for _, rule := range group.Rules {
					collect(fmt.Sprintf("%s: group %q, rule %q%s", file, group.Name, rule.Alert, rule.Record), rule.Expr)
				}
			}
		}
	} else {
		lines := bufio.NewScanner(os.Stdin)
		lines.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; lines.Scan(); n++ {
			if text := strings.TrimSpace(lines.Text()); text != "" {
				collect(fmt.Sprintf("stdin line %d", n), text)
			}
		}
		if err := lines.Err(); err != nil {
			fail("reading stdin: %v", err)
		}
	}
	if failed {
		os.Exit(1)
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	for _, name := range sorted {
		fmt.Println(name)
	}
}
