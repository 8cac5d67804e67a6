package rotation

import (
	"strings"
	"testing"
	"time"
)

func TestParseSchedule(t *testing.T) {
	from := time.Date(2025, time.March, 10, 12, 0, 0, 0, time.UTC) // a Monday, CET in Berlin
	cases := map[string]struct {
		spec string
		from time.Time
		want time.Time
	}{
		"five fields run in UTC without a zone": {
			spec: "0 3 * * *", from: from, want: time.Date(2025, 3, 11, 3, 0, 0, 0, time.UTC),
		},
		"CRON_TZ Europe/Berlin in winter is UTC+1": {
			spec: "CRON_TZ=Europe/Berlin 0 3 * * *", from: from, want: time.Date(2025, 3, 11, 2, 0, 0, 0, time.UTC),
		},
		"CRON_TZ Europe/Berlin in summer is UTC+2": {
			spec: "CRON_TZ=Europe/Berlin 0 3 * * *", from: time.Date(2025, 7, 1, 12, 0, 0, 0, time.UTC),
			want: time.Date(2025, 7, 2, 1, 0, 0, 0, time.UTC),
		},
		"TZ prefix with weekday range": {
			spec: "TZ=America/New_York 30 9 * * 1-5", from: time.Date(2025, 7, 4, 12, 0, 0, 0, time.UTC),
			want: time.Date(2025, 7, 4, 13, 30, 0, 0, time.UTC),
		},
		"names of months and days": {
			spec: "0 0 1 jan *", from: from, want: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		},
		"extra whitespace is tolerated": {
			spec: "  0   3 * *   *  ", from: from, want: time.Date(2025, 3, 11, 3, 0, 0, 0, time.UTC),
		},
		"@daily": {
			spec: "@daily", from: from, want: time.Date(2025, 3, 11, 0, 0, 0, 0, time.UTC),
		},
		"@hourly": {
			spec: "@hourly", from: from.Add(34 * time.Minute), want: time.Date(2025, 3, 10, 13, 0, 0, 0, time.UTC),
		},
		"@weekly starts on Sunday": {
			spec: "@weekly", from: from, want: time.Date(2025, 3, 16, 0, 0, 0, 0, time.UTC),
		},
		"@daily in a zone": {
			spec: "CRON_TZ=Europe/Berlin @daily", from: from, want: time.Date(2025, 3, 10, 23, 0, 0, 0, time.UTC),
		},
		"@every 6h": {
			spec: "@every 6h", from: from, want: from.Add(6 * time.Hour),
		},
		"@every with a zone ignores the zone": {
			spec: "CRON_TZ=Asia/Tokyo @every 90m", from: from, want: from.Add(90 * time.Minute),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := ParseSchedule(tc.spec)
			if err != nil {
				t.Fatalf("ParseSchedule(%q): %v", tc.spec, err)
			}
			if got := s.Next(tc.from); !got.Equal(tc.want) {
				t.Errorf("Next(%s) = %s, want %s", tc.from, got.UTC(), tc.want)
			}
			if got := s.String(); got != strings.TrimSpace(tc.spec) {
				t.Errorf("String() = %q, want %q", got, strings.TrimSpace(tc.spec))
			}
		})
	}
}

func TestParseScheduleErrors(t *testing.T) {
	cases := map[string]struct {
		spec string
		want []string // substrings of the error
	}{
		"empty":                      {spec: "  ", want: []string{"schedule is empty"}},
		"four fields":                {spec: "0 3 * *", want: []string{"expected 5 fields", "found 4"}},
		"six fields (no seconds)":    {spec: "0 0 3 * * *", want: []string{"expected 5 fields", "found 6"}},
		"unknown time zone":          {spec: "CRON_TZ=Mars/Olympus 0 3 * * *", want: []string{`time zone "Mars/Olympus"`, "unknown time zone"}},
		"unknown time zone with TZ=": {spec: "TZ=Europe/Atlantis @daily", want: []string{`time zone "Europe/Atlantis"`}},
		"zone without schedule":      {spec: "CRON_TZ=Europe/Berlin", want: []string{"nothing follows the time zone"}},
		"empty zone":                 {spec: "CRON_TZ= 0 3 * * *", want: []string{"time zone is empty"}},
		"Local zone":                 {spec: "TZ=Local 0 3 * * *", want: []string{`"Local"`, "IANA"}},
		"minute out of range":        {spec: "61 * * * *", want: []string{`minute field "61"`, "above maximum (59)"}},
		"bad day of week":            {spec: "0 3 * * funday", want: []string{`day-of-week field "funday"`}},
		"unknown descriptor":         {spec: "@fortnightly", want: []string{"unrecognized descriptor: @fortnightly"}},
		"@every without duration":    {spec: "@every soon", want: []string{"@every needs a duration"}},
		"@every zero":                {spec: "@every 0s", want: []string{"at least 1s"}},
		"@every negative":            {spec: "@every -1h", want: []string{"at least 1s"}},
		"never fires":                {spec: "0 0 30 2 *", want: []string{"never fires"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := ParseSchedule(tc.spec)
			if err == nil {
				t.Fatalf("ParseSchedule(%q) = %v, want an error", tc.spec, s)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestNextRotation(t *testing.T) {
	daily := mustSchedule(t, "0 3 * * *")
	last := time.Date(2025, 6, 1, 3, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		schedule Schedule
		last     time.Time
		want     time.Time
	}{
		"no schedule":              {schedule: nil, last: last, want: time.Time{}},
		"never rotated":            {schedule: daily, last: time.Time{}, want: time.Time{}},
		"next tick after last":     {schedule: daily, last: last, want: last.Add(24 * time.Hour)},
		"between ticks":            {schedule: daily, last: last.Add(5 * time.Hour), want: last.Add(24 * time.Hour)},
		"every interval from last": {schedule: mustSchedule(t, "@every 6h"), last: last, want: last.Add(6 * time.Hour)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := NextRotation(tc.schedule, tc.last); !got.Equal(tc.want) {
				t.Errorf("NextRotation = %s, want %s", got, tc.want)
			}
		})
	}
}

// mustSchedule parses spec or fails the test.
func mustSchedule(t testing.TB, spec string) Schedule {
	t.Helper()
	s, err := ParseSchedule(spec)
	if err != nil {
		t.Fatalf("ParseSchedule(%q): %v", spec, err)
	}
	return s
}
