package rotation

import (
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

func TestDecide(t *testing.T) {
	const key = "uid-1/lease-1"
	now := time.Date(2025, time.June, 2, 10, 0, 0, 0, time.UTC) // issuedAt + 10m
	yesterday3am := time.Date(2025, time.June, 1, 3, 0, 0, 0, time.UTC)
	daily := mustSchedule(t, "0 3 * * *")
	every15m := mustSchedule(t, "@every 15m")
	renewAt := NextRenewal(issuedAt, time.Hour, 67, key) // within 10:24:12..10:36:12
	cappedAt := now.Add(-time.Minute)
	cappedReplaceAt := NextRenewal(cappedAt, 20*time.Minute, 67, key) // within 10:10:24..10:14:24
	tokenReplaceAt := NextRenewal(issuedAt, 30*time.Minute, 67, key)  // within 10:12:06..10:18:06
	window := func(start string, d time.Duration) *Window {
		w, err := ParseWindow(start, d, "UTC")
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	base := Input{
		Now: now, HasCredential: true, ExpiresAt: issuedAt.Add(time.Hour), Renewable: true,
		RenewedAt: issuedAt, LeaseDuration: time.Hour, MinTTL: time.Minute, RenewalPercent: 67,
		RenewalKey: key, Schedule: daily, LastRotation: issuedAt, DeliveredAt: issuedAt.Add(time.Minute),
	}
	// rotated says the credential was rotated at at and delivered (on every node, rolled out)
	// five minutes later.
	rotated := func(in *Input, at time.Time) { in.LastRotation, in.DeliveredAt = at, at.Add(5*time.Minute) }
	everyMinute := mustSchedule(t, "* * * * *")
	// minute is the first full minute after now; firstIssue, eleven seconds before it, is when
	// the first credential of a cluster on a one-minute schedule was issued.
	minute := now.Add(time.Minute)
	firstIssue := minute.Add(-11 * time.Second)
	firstCredential := func(in *Input) {
		in.Schedule, in.IssuedAt, in.LastRotation, in.RenewedAt = everyMinute, firstIssue, firstIssue, firstIssue
		in.ExpiresAt, in.DeliveredAt = firstIssue.Add(time.Hour), time.Time{}
	}
	firstRenewAt := NextRenewal(firstIssue, time.Hour, 67, key)
	capped := func(in *Input) {
		in.RenewalCapped, in.CappedTTL, in.RenewedAt, in.ExpiresAt = true, 20*time.Minute, cappedAt, cappedAt.Add(20*time.Minute)
	}
	cases := map[string]struct {
		in   func(*Input)
		want Decision
	}{
		"nothing to do until the renewal": {
			in: func(*Input) {}, want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: renewAt},
		},
		// @every counts from the delivery, a minute after the issue.
		"nothing to do until a rotation sooner than the renewal": {
			in:   func(in *Input) { in.Schedule = every15m },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: issuedAt.Add(16 * time.Minute)},
		},
		"no credential": {
			in:   func(in *Input) { in.HasCredential, in.RotateNow = false, "1" },
			want: Decision{Action: ActionIssue, Reason: ReasonNoCredential, When: now, AcknowledgeRotateNow: true},
		},
		"lease gone, even when paused": {
			in:   func(in *Input) { in.LeaseGone, in.Paused = true, true },
			want: Decision{Action: ActionIssue, Reason: ReasonLeaseGone, When: now},
		},
		"lease expired, even during a rollout": {
			in:   func(in *Input) { in.Now, in.RolloutInProgress = in.ExpiresAt, true },
			want: Decision{Action: ActionIssue, Reason: ReasonLeaseExpired, When: issuedAt.Add(time.Hour)},
		},
		"renewal due": {
			in:   func(in *Input) { in.Now = renewAt },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: renewAt},
		},
		"renewal overdue after downtime is due now, not in the past": {
			in:   func(in *Input) { in.Now = issuedAt.Add(55 * time.Minute) },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: issuedAt.Add(55 * time.Minute)},
		},
		"renewal goes on while paused": {
			in:   func(in *Input) { in.Now, in.Paused = renewAt, true },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: renewAt},
		},
		"renewal capped below minTTL": {
			in: func(in *Input) {
				capped(in)
				in.CappedTTL, in.ExpiresAt = 30*time.Second, cappedAt.Add(90*time.Second)
			},
			want: Decision{Action: ActionRotate, Reason: ReasonRenewalCapped, When: now},
		},
		"renewal capped above minTTL waits for the renewal point": {
			in:   capped,
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: cappedReplaceAt},
		},
		"renewal capped above minTTL, at the renewal point": {
			in:   func(in *Input) { capped(in); in.Now = cappedReplaceAt },
			want: Decision{Action: ActionRotate, Reason: ReasonRenewalCapped, When: cappedReplaceAt},
		},
		"non-renewable far from expiry": {
			in:   func(in *Input) { in.Renewable = false },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: renewAt},
		},
		"non-renewable within minTTL of expiry": {
			in:   func(in *Input) { in.Renewable, in.Now = false, in.ExpiresAt.Add(-30*time.Second) },
			want: Decision{Action: ActionRotate, Reason: ReasonNotRenewable, When: issuedAt.Add(59*time.Minute + 30*time.Second)},
		},
		"non-renewable with a long minTTL is replaced minTTL before expiry": {
			in:   func(in *Input) { in.Renewable, in.MinTTL = false, 30*time.Minute },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: issuedAt.Add(30 * time.Minute)},
		},
		"non-renewable near expiry is replaced even when paused": {
			in:   func(in *Input) { in.Renewable, in.Paused, in.Now = false, true, renewAt },
			want: Decision{Action: ActionRotate, Reason: ReasonNotRenewable, When: renewAt},
		},
		"non-renewable with minTTL longer than the lease is not replaced at once": {
			in: func(in *Input) {
				in.Renewable, in.MinTTL, in.RenewedAt, in.ExpiresAt = false, 2*time.Hour, now, now.Add(time.Hour)
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: now.Add(6 * time.Minute)},
		},
		"scheduled rotation due": {
			in:   func(in *Input) { rotated(in, yesterday3am) },
			want: Decision{Action: ActionRotate, Reason: ReasonScheduledRotation, When: now},
		},
		"missed rotation is due once": {
			in:   func(in *Input) { rotated(in, yesterday3am.Add(-5*24*time.Hour)) },
			want: Decision{Action: ActionRotate, Reason: ReasonMissedRotation, When: now},
		},
		"first credential, not delivered yet at the minute: the scheduled rotation waits": {
			in:   func(in *Input) { firstCredential(in); in.Now = minute },
			want: Decision{Action: ActionNothing, Reason: ReasonNotDelivered, When: minute.Add(time.Minute)},
		},
		"first credential, not delivered yet long after the minute: still waits, and nothing is planned in the past": {
			in:   func(in *Input) { firstCredential(in); in.Now = minute.Add(90 * time.Second) },
			want: Decision{Action: ActionNothing, Reason: ReasonNotDelivered, When: minute.Add(2 * time.Minute)},
		},
		"first credential delivered after the minute: rotated at the next minute, not at once": {
			in: func(in *Input) {
				firstCredential(in)
				in.DeliveredAt, in.Now = minute.Add(20*time.Second), minute.Add(21*time.Second)
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: minute.Add(time.Minute)},
		},
		"first credential delivered after the minute: rotated at the next minute": {
			in: func(in *Input) {
				firstCredential(in)
				in.DeliveredAt, in.Now = minute.Add(20*time.Second), minute.Add(time.Minute)
			},
			want: Decision{Action: ActionRotate, Reason: ReasonScheduledRotation, When: minute.Add(time.Minute)},
		},
		"first credential delivered before the minute: rotated at the minute": {
			in: func(in *Input) {
				firstCredential(in)
				in.DeliveredAt, in.Now = minute.Add(-2*time.Second), minute
			},
			want: Decision{Action: ActionRotate, Reason: ReasonScheduledRotation, When: minute},
		},
		"a rollout longer than the schedule's period: the next rotation comes at the activation after it": {
			in: func(in *Input) {
				in.Schedule, in.LastRotation = everyMinute, now.Add(-150*time.Second)
				in.DeliveredAt, in.Now = now.Add(20*time.Second), now.Add(21*time.Second)
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: minute},
		},
		"not delivered: rotate-now still rotates at once": {
			in:   func(in *Input) { firstCredential(in); in.Now, in.RotateNow = minute, "1" },
			want: Decision{Action: ActionRotate, Reason: ReasonRotateNowRequested, When: minute, AcknowledgeRotateNow: true},
		},
		"not delivered: a lease that cannot be renewed is still replaced before it ends": {
			in: func(in *Input) {
				firstCredential(in)
				in.Renewable, in.Now = false, in.ExpiresAt.Add(-30*time.Second)
			},
			want: Decision{Action: ActionRotate, Reason: ReasonNotRenewable, When: firstIssue.Add(time.Hour - 30*time.Second)},
		},
		"not delivered: the lease is still renewed": {
			in:   func(in *Input) { firstCredential(in); in.Now = firstRenewAt },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: firstRenewAt},
		},
		"rotate-now waiting for its turn: nothing until the turn": {
			in:   func(in *Input) { in.RotateNow, in.RotationsHeldUntil = "1", now.Add(3*time.Second) },
			want: Decision{Action: ActionNothing, Reason: ReasonWaitingForTurn, When: now.Add(3 * time.Second)},
		},
		"rotate-now at its turn": {
			in:   func(in *Input) { in.RotateNow, in.RotationsHeldUntil = "1", now },
			want: Decision{Action: ActionRotate, Reason: ReasonRotateNowRequested, When: now, AcknowledgeRotateNow: true},
		},
		"scheduled rotation waiting for its turn: the renewal due goes ahead": {
			in: func(in *Input) {
				in.Now, in.RotationsHeldUntil = renewAt, renewAt.Add(time.Second)
				rotated(in, yesterday3am)
			},
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: renewAt},
		},
		"a replacement that saves the lease does not wait for a turn": {
			in: func(in *Input) {
				in.Renewable, in.Now = false, in.ExpiresAt.Add(-30*time.Second)
				in.RotationsHeldUntil = in.Now.Add(time.Minute)
			},
			want: Decision{Action: ActionRotate, Reason: ReasonNotRenewable, When: issuedAt.Add(59*time.Minute + 30*time.Second)},
		},
		"rotation wins over a renewal due at the same time": {
			in:   func(in *Input) { in.Now = renewAt; rotated(in, yesterday3am) },
			want: Decision{Action: ActionRotate, Reason: ReasonScheduledRotation, When: renewAt},
		},
		"paused holds a due rotation and ignores future ones": {
			in:   func(in *Input) { in.Paused, in.Schedule = true, every15m },
			want: Decision{Action: ActionNothing, Reason: ReasonPaused, When: renewAt},
		},
		"source changed, even when paused": {
			in:   func(in *Input) { in.SourceChanged, in.Paused = true, true },
			want: Decision{Action: ActionRotate, Reason: ReasonSourceChanged, When: now},
		},
		"source changed during a rollout": {
			in:   func(in *Input) { in.SourceChanged, in.RolloutInProgress = true, true },
			want: Decision{Action: ActionNothing, Reason: ReasonRolloutInProgress, When: renewAt},
		},
		"rotate-now requested": {
			in:   func(in *Input) { in.RotateNow, in.RotateNowAcknowledged = "2025-06-02T10:00", "earlier" },
			want: Decision{Action: ActionRotate, Reason: ReasonRotateNowRequested, When: now, AcknowledgeRotateNow: true},
		},
		"rotate-now already acknowledged": {
			in:   func(in *Input) { in.RotateNow, in.RotateNowAcknowledged = "2025-06-02T10:00", "2025-06-02T10:00" },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: renewAt},
		},
		"rotate-now while paused waits": {
			in:   func(in *Input) { in.RotateNow, in.Paused = "1", true },
			want: Decision{Action: ActionNothing, Reason: ReasonPaused, When: renewAt},
		},
		"rotate-now does not wait for the maintenance window": {
			in:   func(in *Input) { in.RotateNow, in.Window = "1", window("22:00", time.Hour) },
			want: Decision{Action: ActionRotate, Reason: ReasonRotateNowRequested, When: now, AcknowledgeRotateNow: true},
		},
		"scheduled rotation waits for a closed window": {
			in:   func(in *Input) { rotated(in, yesterday3am); in.Window = window("10:15", 30*time.Minute) },
			want: Decision{Action: ActionNothing, Reason: ReasonOutsideMaintenanceWindow, When: now.Add(15 * time.Minute)},
		},
		"scheduled rotation in an open window": {
			in:   func(in *Input) { rotated(in, yesterday3am); in.Window = window("09:30", time.Hour) },
			want: Decision{Action: ActionRotate, Reason: ReasonScheduledRotation, When: now},
		},
		"rollout in progress holds a due rotation": {
			in:   func(in *Input) { rotated(in, yesterday3am); in.RolloutInProgress, in.RotateNow = true, "1" },
			want: Decision{Action: ActionNothing, Reason: ReasonRolloutInProgress, When: renewAt},
		},
		"a replacement that saves the lease goes ahead of a rollout in progress": {
			in: func(in *Input) {
				in.Renewable, in.RolloutInProgress, in.Now = false, true, in.ExpiresAt.Add(-30*time.Second)
			},
			want: Decision{Action: ActionRotate, Reason: ReasonNotRenewable, When: issuedAt.Add(time.Hour).Add(-30 * time.Second)},
		},
		"a token that ends goes ahead of a rollout in progress": {
			in: func(in *Input) {
				in.IssuedAt, in.TokenEndsAt, in.Now, in.RolloutInProgress = issuedAt, issuedAt.Add(30*time.Minute), tokenReplaceAt, true
			},
			want: Decision{Action: ActionRotate, Reason: ReasonTokenEnding, When: tokenReplaceAt},
		},
		"rollout in progress does not stop a renewal": {
			in:   func(in *Input) { in.Now, in.RolloutInProgress = renewAt, true },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: renewAt},
		},
		"token ends before the lease: nothing until its replacement point": {
			in:   func(in *Input) { in.IssuedAt, in.TokenEndsAt = issuedAt, issuedAt.Add(30*time.Minute) },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: tokenReplaceAt},
		},
		"token ends before the lease: rotated at the replacement point, even when paused": {
			in: func(in *Input) {
				in.IssuedAt, in.TokenEndsAt, in.Now, in.Paused = issuedAt, issuedAt.Add(30*time.Minute), tokenReplaceAt, true
			},
			want: Decision{Action: ActionRotate, Reason: ReasonTokenEnding, When: tokenReplaceAt},
		},
		"token ends within minTTL: rotated now": {
			in: func(in *Input) {
				in.IssuedAt, in.TokenEndsAt, in.MinTTL = issuedAt, now.Add(time.Minute), 5*time.Minute
			},
			want: Decision{Action: ActionRotate, Reason: ReasonTokenEnding, When: now},
		},
		"token ends after the lease's max TTL: the lease's own replacement covers it": {
			in: func(in *Input) {
				capped(in)
				in.IssuedAt, in.TokenEndsAt = issuedAt, in.ExpiresAt.Add(time.Minute)
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: cappedReplaceAt},
		},
		"token of a minute with the default minTTL of a minute: replaced a third of the span before its end, not at once": {
			in: func(in *Input) {
				in.IssuedAt, in.TokenEndsAt, in.Now = now, now.Add(time.Minute), now.Add(10*time.Second)
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: minTime(NextRenewal(now, time.Minute, 67, key), now.Add(40*time.Second))},
		},
		"lease check due": {
			in:   func(in *Input) { in.NextLeaseCheck = now },
			want: Decision{Action: ActionCheck, Reason: ReasonLeaseCheckDue, When: now},
		},
		"renewal wins over a lease check": {
			in:   func(in *Input) { in.Now, in.NextLeaseCheck = renewAt, now },
			want: Decision{Action: ActionRenew, Reason: ReasonRenewalDue, When: renewAt},
		},
		"nothing to do until the next lease check": {
			in:   func(in *Input) { in.NextLeaseCheck = now.Add(time.Minute) },
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate, When: now.Add(time.Minute)},
		},
		"untracked lease is not checked": {
			in: func(in *Input) {
				in.ExpiresAt, in.Renewable, in.LeaseDuration, in.Schedule, in.NextLeaseCheck = time.Time{}, false, 0, nil, now
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate},
		},
		"untracked lease without schedule: no timed work": {
			in: func(in *Input) {
				in.ExpiresAt, in.Renewable, in.LeaseDuration, in.Schedule = time.Time{}, false, 0, nil
			},
			want: Decision{Action: ActionNothing, Reason: ReasonUpToDate},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := base
			tc.in(&in)
			got := Decide(in)
			if got.Action != tc.want.Action || got.Reason != tc.want.Reason || !got.When.Equal(tc.want.When) ||
				got.AcknowledgeRotateNow != tc.want.AcknowledgeRotateNow {
				t.Errorf("Decide = {%s %s %s ack=%v}, want {%s %s %s ack=%v}", got.Action, got.Reason, got.When,
					got.AcknowledgeRotateNow, tc.want.Action, tc.want.Reason, tc.want.When, tc.want.AcknowledgeRotateNow)
			}
			if got.Action == ActionNothing && !got.When.IsZero() && !got.When.After(in.Now) {
				t.Errorf("Nothing with When %s not after Now %s: the controller would requeue at once", got.When, in.Now)
			}
		})
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestMissedRotationOnce: after a long downtime one rotation is due; once it is recorded the
// decision is Nothing until the schedule's next activation, which is then due again.
func TestMissedRotationOnce(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2025, time.June, 10, 12, 0, 0, 0, time.UTC))
	next := time.Date(2025, time.June, 11, 3, 0, 0, 0, time.UTC)
	in := Input{
		HasCredential: true,
		Schedule:      mustSchedule(t, "0 3 * * *"),
		LastRotation:  time.Date(2025, time.June, 1, 3, 0, 0, 0, time.UTC), // nine activations missed
		DeliveredAt:   time.Date(2025, time.June, 1, 3, 2, 0, 0, time.UTC),
	}
	in.Now = clk.Now()
	if d := Decide(in); d.Action != ActionRotate || d.Reason != ReasonMissedRotation {
		t.Fatalf("after downtime: Decide = %s %s, want Rotate MissedRotation", d.Action, d.Reason)
	}
	in.LastRotation, in.DeliveredAt = clk.Now(), clk.Now() // the controller rotated and delivered it
	for clk.Now().Before(next) {
		in.Now = clk.Now()
		if d := Decide(in); d.Action != ActionNothing || !d.When.Equal(next) {
			t.Fatalf("at %s: Decide = %s %s %s, want Nothing until %s", in.Now, d.Action, d.Reason, d.When, next)
		}
		clk.Step(time.Hour)
	}
	in.Now = clk.Now()
	if d := Decide(in); d.Action != ActionRotate || d.Reason != ReasonScheduledRotation {
		t.Errorf("at the next activation %s: Decide = %s %s, want Rotate ScheduledRotation", in.Now, d.Action, d.Reason)
	}
}

// TestFirstCredentialIsUsedBeforeItIsRotated: on a one-minute schedule, a first credential issued
// eleven seconds before the minute and delivered twenty seconds after it is not replaced at that
// minute, nor the moment it is delivered, but at the minute after its delivery; a rotation asked
// for meanwhile is not held back.
func TestFirstCredentialIsUsedBeforeItIsRotated(t *testing.T) {
	minute := time.Date(2025, time.June, 2, 10, 1, 0, 0, time.UTC)
	issued, delivered := minute.Add(-11*time.Second), minute.Add(20*time.Second)
	clk := testingclock.NewFakeClock(issued)
	in := Input{HasCredential: true, Schedule: mustSchedule(t, "* * * * *"), IssuedAt: issued, LastRotation: issued}
	for ; clk.Now().Before(delivered); clk.Step(time.Second) {
		in.Now = clk.Now()
		if d := Decide(in); d.Action != ActionNothing || !d.When.After(in.Now) {
			t.Fatalf("at %s, not delivered: Decide = %s %s %s, want Nothing until later", in.Now, d.Action, d.Reason, d.When)
		}
		if pending := in; !clk.Now().Before(minute) {
			pending.RotateNow = "1"
			if d := Decide(pending); d.Action != ActionRotate || d.Reason != ReasonRotateNowRequested {
				t.Fatalf("at %s, not delivered: rotate-now gives %s %s, want Rotate RotateNowRequested", in.Now, d.Action, d.Reason)
			}
		}
	}
	in.DeliveredAt = delivered
	next := minute.Add(time.Minute)
	for ; clk.Now().Before(next); clk.Step(time.Second) {
		in.Now = clk.Now()
		if d := Decide(in); d.Action != ActionNothing || !d.When.Equal(next) {
			t.Fatalf("at %s, delivered at %s: Decide = %s %s %s, want Nothing until %s", in.Now, delivered, d.Action, d.Reason, d.When, next)
		}
	}
	in.Now = clk.Now()
	if d := Decide(in); d.Action != ActionRotate || d.Reason != ReasonScheduledRotation {
		t.Errorf("at %s: Decide = %s %s, want Rotate ScheduledRotation", in.Now, d.Action, d.Reason)
	}
}

func TestDeferrable(t *testing.T) {
	for name, tc := range map[string]struct {
		d    Decision
		want bool
	}{
		"rotate-now":                         {Decision{Action: ActionRotate, Reason: ReasonRotateNowRequested}, true},
		"scheduled":                          {Decision{Action: ActionRotate, Reason: ReasonScheduledRotation}, true},
		"missed":                             {Decision{Action: ActionRotate, Reason: ReasonMissedRotation}, true},
		"renewal capped":                     {Decision{Action: ActionRotate, Reason: ReasonRenewalCapped}, false},
		"not renewable":                      {Decision{Action: ActionRotate, Reason: ReasonNotRenewable}, false},
		"token ending":                       {Decision{Action: ActionRotate, Reason: ReasonTokenEnding}, false},
		"source changed":                     {Decision{Action: ActionRotate, Reason: ReasonSourceChanged}, false},
		"first issue":                        {Decision{Action: ActionIssue, Reason: ReasonNoCredential}, false},
		"lease gone":                         {Decision{Action: ActionIssue, Reason: ReasonLeaseGone}, false},
		"issue with rotate-now acknowledged": {Decision{Action: ActionIssue, Reason: ReasonLeaseExpired, AcknowledgeRotateNow: true}, false},
		"renewal":                            {Decision{Action: ActionRenew, Reason: ReasonRenewalDue}, false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.d.Deferrable(); got != tc.want {
				t.Errorf("%s %s: Deferrable = %v, want %v", tc.d.Action, tc.d.Reason, got, tc.want)
			}
		})
	}
}
