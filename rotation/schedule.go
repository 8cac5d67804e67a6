package rotation

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"
)

// Schedule says when scheduled rotations fall due.
type Schedule interface {
	// Next returns the first activation strictly after t, or the zero time if there is none.
	Next(t time.Time) time.Time
	// String returns the spec the schedule was parsed from; equal specs are equal schedules.
	String() string
}

// minEvery is the shortest interval accepted in "@every <duration>".
const minEvery = time.Second

// specParser accepts the standard five fields (minute, hour, day of month, month, day of week) and
// descriptors such as @daily, @hourly and @every 6h, as documented for robfig/cron.
var specParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// neverFiresProbe is the fixed instant from which a parsed schedule must fire at least once
// (robfig/cron searches five years ahead), so that "0 0 30 2 *" is refused.
var neverFiresProbe = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// cronSchedule is a Schedule parsed by ParseSchedule.
type cronSchedule struct {
	spec  string
	inner cron.Schedule
}

// Next implements Schedule.
func (s *cronSchedule) Next(t time.Time) time.Time { return s.inner.Next(t) }

// String implements Schedule.
func (s *cronSchedule) String() string { return s.spec }

// ParseSchedule parses a rotation schedule in robfig/cron syntax: five fields ("0 3 * * 1"), or a
// descriptor (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>),
// optionally prefixed with CRON_TZ=<zone> or TZ=<zone>, where zone is an IANA name. Without a prefix
// the schedule runs in UTC, never in the operator's local time. The error says what is wrong.
func ParseSchedule(spec string) (Schedule, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, errors.New("schedule is empty")
	}
	loc, body, err := splitZone(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	if err := checkBody(body); err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	inner, err := specParser.Parse("CRON_TZ=" + loc.String() + " " + body)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, fieldError(body, err))
	}
	if inner.Next(neverFiresProbe).IsZero() {
		return nil, fmt.Errorf("schedule %q: never fires (no date matches all fields)", spec)
	}
	return &cronSchedule{spec: spec, inner: inner}, nil
}

// splitZone separates an optional CRON_TZ=<zone> or TZ=<zone> prefix from the rest of the spec
// and loads the zone (UTC without a prefix).
func splitZone(spec string) (*time.Location, string, error) {
	var rest string
	switch {
	case strings.HasPrefix(spec, "CRON_TZ="):
		rest = strings.TrimPrefix(spec, "CRON_TZ=")
	case strings.HasPrefix(spec, "TZ="):
		rest = strings.TrimPrefix(spec, "TZ=")
	default:
		return time.UTC, strings.Join(strings.Fields(spec), " "), nil
	}
	i := strings.IndexFunc(rest, unicode.IsSpace)
	if i < 0 || strings.TrimSpace(rest[i:]) == "" {
		return nil, "", errors.New("nothing follows the time zone: expected five fields or a descriptor after it")
	}
	zone, body := rest[:i], strings.Join(strings.Fields(rest[i:]), " ")
	if zone == "" {
		return nil, "", errors.New("time zone is empty")
	}
	if zone == "Local" {
		return nil, "", errors.New(`time zone "Local" depends on the operator's host: name an IANA zone such as Europe/Berlin`)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, "", fmt.Errorf("loading time zone %q: %w", zone, err)
	}
	return loc, body, nil
}

// checkBody checks what robfig/cron reports poorly: the number of fields and the @every interval.
func checkBody(body string) error {
	if every, ok := strings.CutPrefix(body, "@every"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(every))
		if err != nil {
			return fmt.Errorf("@every needs a duration such as 6h or 90m: %w", err)
		}
		if d < minEvery {
			return fmt.Errorf("@every %s: the interval must be at least %s", d, minEvery)
		}
		return nil
	}
	if strings.HasPrefix(body, "@") {
		return nil // robfig/cron names the unknown descriptor
	}
	if n := len(strings.Fields(body)); n != 5 {
		return fmt.Errorf("expected 5 fields (minute hour day-of-month month day-of-week), found %d", n)
	}
	return nil
}

// fieldNames names the five fields of a standard cron spec, in order.
var fieldNames = [5]string{"minute", "hour", "day-of-month", "month", "day-of-week"}

// fieldError names the field robfig/cron rejected: it parses each field alone, the others as "*".
// It returns err unchanged for descriptors or when no single field fails.
func fieldError(body string, err error) error {
	fields := strings.Fields(body)
	if len(fields) != len(fieldNames) {
		return err
	}
	for i, field := range fields {
		probe := []string{"*", "*", "*", "*", "*"}
		probe[i] = field
		if _, ferr := specParser.Parse(strings.Join(probe, " ")); ferr != nil {
			return fmt.Errorf("%s field %q: %w", fieldNames[i], field, ferr)
		}
	}
	return err
}

// NextRotation returns when the rotation after lastRotation falls due: schedule.Next(lastRotation).
// A result at or before now means a rotation is due; one missed while the operator was down is due
// once, however many activations it missed, because only the first one after lastRotation counts.
// It returns the zero time without a schedule or when lastRotation is zero (nothing issued yet).
func NextRotation(schedule Schedule, lastRotation time.Time) time.Time {
	if schedule == nil || lastRotation.IsZero() {
		return time.Time{}
	}
	return schedule.Next(lastRotation)
}
