#!/bin/sh
# Installs the Debian packages a tox env needs, when their commands are
# missing: each argument is PACKAGE:COMMAND (e.g. nginx-light:nginx).
# As root it runs apt-get; otherwise it says what to install and fails.
# Envs that run at once (`tox p`) take turns through a lock file.
set -eu
missing=""
for pair in "$@"; do
    package=${pair%%:*}
    command=${pair#*:}
    if ! command -v "$command" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$command" ]; then
        missing="$missing $package"
    fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages:$missing (install them: sudo apt-get install$missing)" >&2
    exit 1
fi
exec 9>/tmp/buildmax-debian-packages.lock
flock 9
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $missing >/dev/null
}
echo "installed Debian packages:$missing"
