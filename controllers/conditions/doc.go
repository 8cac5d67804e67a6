// Package conditions sets the conditions of a keyroll object's status and records the events of
// their changes, once each and only after the status that carries the change is written.
package conditions
