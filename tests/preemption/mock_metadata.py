"""Mock cloud metadata services on 127.0.0.1 for the preemption tests.

usage: mock_metadata.py CLOUD --port-file F --notice-file N [--lifetime S]
                        [--log L] [--rebalance]

CLOUD is aws, gcp or azure.  The server binds an ephemeral loopback port,
writes it to F, and answers like the real service, insisting on the same
headers; the notice becomes active once the file N exists.  It exits on its
own after --lifetime seconds (default 120), so a failed test cannot leave it
running.  Every request is appended to L as one JSON line.

  aws    IMDSv2: PUT /latest/api/token needs X-aws-ec2-metadata-token-ttl-
         seconds; GETs need X-aws-ec2-metadata-token (else 401).
         spot/instance-action: 404, then 200 {"action": "terminate", ...};
         events/recommendations/rebalance: 404, or 200 with --rebalance.
  gcp    /computeMetadata/v1/instance/preempted needs Metadata-Flavor:
         Google (else 403): FALSE, then TRUE.
  azure  /metadata/scheduledevents?api-version=2020-07-01 needs Metadata:
         true (else 400): a Preempt event for another VM ("other-vm") from
         the start, plus one for this VM ("vm-under-test") once noticed.
         /metadata/instance/compute/name answers "vm-under-test".
"""
import argparse
import http.server
import json
import os
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("cloud", choices=["aws", "gcp", "azure"])
ap.add_argument("--port-file", required=True)
ap.add_argument("--notice-file", required=True)
ap.add_argument("--lifetime", type=float, default=120)
ap.add_argument("--log")
ap.add_argument("--rebalance", action="store_true")
args = ap.parse_args()
TOKEN = "AQAEAmocktoken=="
lock = threading.Lock()


def noticed():
    return os.path.exists(args.notice_file)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body="", ctype="text/plain", extra=None):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        if args.log:
            with lock, open(args.log, "a") as f:
                f.write(json.dumps({"method": self.command, "path": self.path, "status": code,
                                    "headers": dict(self.headers)}) + "\n")

    def do_PUT(self):
        if args.cloud == "aws" and self.path == "/latest/api/token":
            if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self.reply(400, "missing TTL header")
            return self.reply(200, TOKEN)
        self.reply(404, "not found")

    def do_GET(self):
        c = args.cloud
        if c == "aws":
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return self.reply(401, "")
            if self.path == "/latest/meta-data/spot/instance-action":
                if noticed() and not args.rebalance:
                    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
                    return self.reply(200, json.dumps({"action": "terminate", "time": t}),
                                      "application/json")
                return self.reply(404, "")
            if self.path == "/latest/meta-data/events/recommendations/rebalance":
                if noticed() and args.rebalance:
                    return self.reply(200, json.dumps({"noticeTime": "2024-06-11T12:00:00Z"}),
                                      "application/json")
                return self.reply(404, "")
        elif c == "gcp":
            if self.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self.reply(403, "Missing Metadata-Flavor:Google header.")
                return self.reply(200, "TRUE" if noticed() else "FALSE",
                                  extra={"Metadata-Flavor": "Google"})
        elif c == "azure":
            if self.headers.get("Metadata") != "true":
                return self.reply(400, json.dumps({"error": "Bad request"}), "application/json")
            if self.path.startswith("/metadata/instance/compute/name"):
                return self.reply(200, "vm-under-test")
            if self.path == "/metadata/scheduledevents?api-version=2020-07-01":
                events = [{"EventId": "A1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                           "Resources": ["other-vm"], "EventStatus": "Scheduled",
                           "NotBefore": "Tue, 11 Jun 2024 12:00:30 GMT", "Description": "",
                           "EventSource": "Platform", "DurationInSeconds": -1},
                          {"EventId": "F1", "EventType": "Freeze", "ResourceType": "VirtualMachine",
                           "Resources": ["vm-under-test"], "EventStatus": "Scheduled",
                           "NotBefore": "", "Description": "", "EventSource": "Platform",
                           "DurationInSeconds": 9}]
                if noticed():
                    events.append({"EventId": "B2", "EventType": "Preempt",
                                   "ResourceType": "VirtualMachine",
                                   "Resources": ["vm-under-test"], "EventStatus": "Scheduled",
                                   "NotBefore": "Tue, 11 Jun 2024 12:00:30 GMT",
                                   "Description": "", "EventSource": "Platform",
                                   "DurationInSeconds": -1})
                return self.reply(200, json.dumps({"DocumentIncarnation": 2 if noticed() else 1,
                                                   "Events": events}), "application/json")
        self.reply(404, "not found")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
tmp = args.port_file + ".tmp"
with open(tmp, "w") as f:
    f.write(str(server.server_address[1]))
os.rename(tmp, args.port_file)
threading.Timer(args.lifetime, server.shutdown).start()
server.serve_forever()
