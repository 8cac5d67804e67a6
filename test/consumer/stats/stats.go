// Package stats holds the counters test/consumer serves on /stats and writes as its final
// counters (its termination message), in the JSON both use: the consumer fills them, the tests
// read them (testground.ConsumerStats).
package stats

// Stats are the consumer's counters, as /stats serves them.
type Stats struct {
	// OK and Failed count commands (each SET and each GET is one).
	OK     int64 `json:"ok"`
	Failed int64 `json:"failed"`
	// Connects counts connections that authenticated; CredentialReloads, changes of the files.
	Connects          int64  `json:"connects"`
	CredentialReloads int64  `json:"credentialReloads"`
	User              string `json:"user"`
	LastError         string `json:"lastError,omitempty"`
	LastFailure       string `json:"lastFailure,omitempty"`
	// LongestOutageMs is the longest time from a failed command to the next that succeeded.
	LongestOutageMs int64 `json:"longestOutageMs"`
	// LostWrites counts GETs that returned an older value than the last SET Redis acknowledged:
	// an acknowledged write that was lost.
	LostWrites int64 `json:"lostWrites"`
	// Failures are the first failed commands, each with its moment and reason (the consumer keeps
	// twelve, so that the final counters fit a termination message): what a test needs to explain
	// failures that LastError alone, the reason of the last, does not.
	Failures []Failure `json:"failures,omitempty"`
}

// Failure is one failed command: when (RFC 3339), which (SET or GET), as which user, and why.
type Failure struct {
	At    string `json:"at"`
	Op    string `json:"op"`
	User  string `json:"user"`
	Error string `json:"error"`
}
