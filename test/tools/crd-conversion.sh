#!/usr/bin/env bash
# Gives each CRD that controller-gen wrote (the files named as arguments) its conversion settings:
# the webhook at Service keyroll-webhook in keyroll-system, path /convert. A CRD served in more
# than one version must never convert with strategy None (which only relabels the object and drops
# the fields of the other shape); with Webhook, a conversion keyroll cannot serve yet fails with an
# error instead. keyroll points the CRDs at its actual Service (another namespace or release name)
# and adds the CA bundle when it starts. make manifests runs it.
set -euo pipefail
for f in "$@"; do
	grep -q '^  conversion:$' "$f" && continue
	awk '
		{ print }
		/^spec:$/ && !done {
			print "  conversion:"
			print "    strategy: Webhook"
			print "    webhook:"
			print "      clientConfig:"
			print "        service:"
			print "          name: keyroll-webhook"
			print "          namespace: keyroll-system"
			print "          path: /convert"
			print "          port: 443"
			print "      conversionReviewVersions:"
			print "      - v1"
			done = 1
		}
	' "$f" > "$f.tmp"
	mv "$f.tmp" "$f"
done
