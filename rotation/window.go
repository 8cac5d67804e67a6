package rotation

import (
	"errors"
	"fmt"
	"time"
)

// Window is a daily maintenance window: it opens every day at a time of day in a time zone and
// stays open for a duration of up to 24 hours. Scheduled rotations wait for it; requested ones
// (rotate-now) and the replacement of a credential that cannot be kept alive do not.
type Window struct {
	hour, minute int
	duration     time.Duration
	loc          *time.Location
}

// ParseWindow parses a window that opens daily at start ("HH:MM", 24-hour clock) in timeZone (an
// IANA name; empty means UTC) and stays open for duration (more than zero, at most 24h).
func ParseWindow(start string, duration time.Duration, timeZone string) (*Window, error) {
	at, err := time.Parse("15:04", start)
	if err != nil || len(start) != len("15:04") {
		return nil, fmt.Errorf("maintenance window start %q: expected HH:MM between 00:00 and 23:59", start)
	}
	if duration <= 0 || duration > 24*time.Hour {
		return nil, fmt.Errorf("maintenance window duration %s: must be more than 0 and at most 24h", duration)
	}
	if timeZone == "" {
		timeZone = "UTC"
	}
	if timeZone == "Local" {
		return nil, errors.New(`maintenance window time zone "Local" depends on the operator's host: name an IANA zone`)
	}
	loc, err := time.LoadLocation(timeZone)
	if err != nil {
		return nil, fmt.Errorf("maintenance window: loading time zone %q: %w", timeZone, err)
	}
	return &Window{hour: at.Hour(), minute: at.Minute(), duration: duration, loc: loc}, nil
}

// Contains reports whether the window is open at t (the opening instant included, the closing one
// not).
func (w *Window) Contains(t time.Time) bool {
	for _, day := range []int{-1, 0} {
		open := w.openingOn(t, day)
		if !t.Before(open) && t.Before(open.Add(w.duration)) {
			return true
		}
	}
	return false
}

// NextOpen returns t when the window is open at t, and otherwise when it next opens.
func (w *Window) NextOpen(t time.Time) time.Time {
	if w.Contains(t) {
		return t
	}
	if open := w.openingOn(t, 0); open.After(t) {
		return open
	}
	return w.openingOn(t, 1)
}

// String describes the window, for messages.
func (w *Window) String() string {
	return fmt.Sprintf("%02d:%02d %s for %s", w.hour, w.minute, w.loc, w.duration)
}

// openingOn returns when the window opens on the day that is days after t's day in the window's
// zone. On a day when the clock skips the opening time (DST), it opens at the shifted instant.
func (w *Window) openingOn(t time.Time, days int) time.Time {
	local := t.In(w.loc)
	return time.Date(local.Year(), local.Month(), local.Day()+days, w.hour, w.minute, 0, 0, w.loc)
}
