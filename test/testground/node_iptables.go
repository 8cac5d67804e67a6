package testground

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// iptablesCommands are the iptables front ends whose tables the node may have changed.
func iptablesCommands() []string {
	var out []string
	for _, c := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(c + "-save"); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// nodeChain reports whether an iptables chain is one the node's components create: kube-proxy's
// and the kubelet's (KUBE-), or a CNI plugin's (CNI-).
func nodeChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// NodeIPTablesChains lists, per iptables front end and table, the node's chains that exist.
func NodeIPTablesChains() []string {
	var out []string
	for _, cmd := range iptablesCommands() {
		b, err := exec.Command(cmd + "-save").Output()
		if err != nil {
			continue
		}
		table := ""
		for _, line := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":") && nodeChain(strings.Fields(line[1:])[0]):
				out = append(out, fmt.Sprintf("%s %s %s", cmd, table, strings.Fields(line[1:])[0]))
			}
		}
	}
	return out
}

// cleanIPTables removes the node's chains from every table: first the rules of other chains that
// jump to them, then their rules, then the chains, in one iptables-restore per table (which
// parses the saved rules, quotes included).
func cleanIPTables() error {
	var errs []error
	for _, cmd := range iptablesCommands() {
		b, err := exec.Command(cmd + "-save").Output()
		if err != nil {
			continue
		}
		for table, script := range iptablesCleanupScripts(string(b)) {
			c := exec.Command(cmd+"-restore", "--noflush")
			c.Stdin = strings.NewReader(script)
			if out, err := c.CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s-restore (%s table): %w: %s", cmd, table, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesCleanupScripts turns iptables-save output into, per table that holds node chains, the
// iptables-restore input that deletes them.
func iptablesCleanupScripts(saved string) map[string]string {
	out := map[string]string{}
	table := ""
	var chains, deletes []string
	flush := func() {
		if table != "" && len(chains) > 0 {
			var b strings.Builder
			fmt.Fprintf(&b, "*%s\n", table)
			for _, d := range deletes {
				fmt.Fprintln(&b, d)
			}
			for _, c := range chains {
				fmt.Fprintf(&b, "-F %s\n", c)
			}
			for _, c := range chains {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
			b.WriteString("COMMIT\n")
			out[table] = b.String()
		}
		chains, deletes = nil, nil
	}
	for _, line := range strings.Split(saved, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			if name := strings.Fields(line[1:])[0]; nodeChain(name) {
				chains = append(chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) > 1 && !nodeChain(f[1]) && jumpsToNodeChain(f) {
				deletes = append(deletes, "-D"+strings.TrimPrefix(line, "-A"))
			}
		}
	}
	flush()
	return out
}

func jumpsToNodeChain(fields []string) bool {
	for i, f := range fields[:len(fields)-1] {
		if (f == "-j" || f == "-g") && nodeChain(fields[i+1]) {
			return true
		}
	}
	return false
}
