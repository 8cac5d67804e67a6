package framework

import (
	"fmt"
	"os"
	"strings"
)

// WriteSection replaces what doc holds between the lines begin and end (HTML comments, so that
// the Markdown shows nothing of them) with text: the measured figures a make target writes into
// the docs.
func WriteSection(doc, begin, end, text string) error {
	b, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q markers", doc, begin, end)
	}
	s = s[:i+len(begin)] + "\n\n" + strings.TrimRight(text, "\n") + "\n\n" + s[j:]
	return os.WriteFile(doc, []byte(s), 0o644)
}
