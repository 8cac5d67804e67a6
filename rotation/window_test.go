package rotation

import (
	"strings"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	utc := func(m time.Month, d, h, min int) time.Time { return time.Date(2025, m, d, h, min, 0, 0, time.UTC) }
	cases := map[string]struct {
		start    string
		duration time.Duration
		zone     string
		at       time.Time
		open     bool
		nextOpen time.Time
	}{
		"before the window": {
			start: "02:00", duration: 2 * time.Hour, at: utc(6, 2, 1, 59), nextOpen: utc(6, 2, 2, 0),
		},
		"at the opening instant": {
			start: "02:00", duration: 2 * time.Hour, at: utc(6, 2, 2, 0), open: true, nextOpen: utc(6, 2, 2, 0),
		},
		"at the closing instant": {
			start: "02:00", duration: 2 * time.Hour, at: utc(6, 2, 4, 0), nextOpen: utc(6, 3, 2, 0),
		},
		"across midnight, after midnight": {
			start: "23:00", duration: 3 * time.Hour, at: utc(6, 3, 1, 30), open: true, nextOpen: utc(6, 3, 1, 30),
		},
		"across midnight, before it opens": {
			start: "23:00", duration: 3 * time.Hour, at: utc(6, 3, 12, 0), nextOpen: utc(6, 3, 23, 0),
		},
		"in Europe/Berlin summer time": {
			start: "02:00", duration: time.Hour, zone: "Europe/Berlin", at: utc(6, 2, 0, 30), open: true, nextOpen: utc(6, 2, 0, 30),
		},
		"in Europe/Berlin, closed": {
			start: "02:00", duration: time.Hour, zone: "Europe/Berlin", at: utc(6, 2, 1, 0), nextOpen: utc(6, 3, 0, 0),
		},
		"open all day": {
			start: "00:00", duration: 24 * time.Hour, at: utc(6, 2, 17, 45), open: true, nextOpen: utc(6, 2, 17, 45),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w, err := ParseWindow(tc.start, tc.duration, tc.zone)
			if err != nil {
				t.Fatalf("ParseWindow: %v", err)
			}
			if got := w.Contains(tc.at); got != tc.open {
				t.Errorf("Contains(%s) = %v, want %v", tc.at, got, tc.open)
			}
			if got := w.NextOpen(tc.at); !got.Equal(tc.nextOpen) {
				t.Errorf("NextOpen(%s) = %s, want %s", tc.at, got.UTC(), tc.nextOpen)
			}
		})
	}
}

func TestParseWindowErrors(t *testing.T) {
	cases := map[string]struct {
		start    string
		duration time.Duration
		zone     string
		want     string
	}{
		"hour out of range": {start: "24:00", duration: time.Hour, want: "expected HH:MM"},
		"single-digit hour": {start: "2:00", duration: time.Hour, want: "expected HH:MM"},
		"not a time":        {start: "noon", duration: time.Hour, want: "expected HH:MM"},
		"zero duration":     {start: "02:00", duration: 0, want: "must be more than 0"},
		"over a day":        {start: "02:00", duration: 25 * time.Hour, want: "at most 24h"},
		"unknown zone":      {start: "02:00", duration: time.Hour, zone: "Mars/Olympus", want: `time zone "Mars/Olympus"`},
		"host-local zone":   {start: "02:00", duration: time.Hour, zone: "Local", want: "IANA"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseWindow(tc.start, tc.duration, tc.zone)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseWindow error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestWindowString(t *testing.T) {
	w, err := ParseWindow("02:30", 90*time.Minute, "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.String(), "02:30 Europe/Berlin for 1h30m0s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
