#!/bin/sh
# The broker runs as its own system user, writing only its audit trail.
set -e
if ! getent passwd gpu-broker >/dev/null; then
  useradd --system --home-dir /etc/gpu-broker --no-create-home --shell /usr/sbin/nologin gpu-broker
fi
mkdir -p /var/log/gpu-broker
chown gpu-broker:gpu-broker /var/log/gpu-broker
chgrp gpu-broker /etc/gpu-broker/broker.hcl
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
