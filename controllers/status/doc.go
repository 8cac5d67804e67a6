// Package status is what the controllers share to write a status: its conditions, set with the
// events of their changes, recorded once each and only after the status that carries the change
// is written (conditions.go); and its times, at the second the API keeps, with the requeue delays
// they become (times.go).
package status
