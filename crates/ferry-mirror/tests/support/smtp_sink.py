"""A real SMTP server for the alarm tests, built on aiosmtpd.

Listens on 127.0.0.1 on a free port and prints that port on the first line of stdout. Each message it accepts
is written to OUT_DIR/msg-NNNN.json (written to a temporary name, then renamed, so a reader never sees half a
file) with the envelope, the authenticated login, and the decoded subject, headers and plain-text body.

    python3 smtp_sink.py OUT_DIR [--user USER --password PASSWORD] [--tls starttls|implicit --cert PEM --key PEM]

With --user and --password, AUTH (PLAIN, LOGIN) is required and only that pair is accepted; TLS is not
required for it, because the test talks to it over loopback. With --tls starttls, STARTTLS is offered and
required before any mail; with --tls implicit, the listener speaks TLS from the first byte. Each message records
the TLS version it arrived under (null for none).
"""

import argparse
import asyncio
import email
import email.policy
import json
import logging
import os
import ssl
import sys
import warnings

# aiosmtpd warns that AUTH without TLS is unsafe; over loopback in a test it is what we want.
warnings.filterwarnings("ignore")
logging.getLogger("mail.log").setLevel(logging.ERROR)

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Sink:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        login = None
        if isinstance(session.auth_data, LoginPassword):
            login = session.auth_data.login.decode("utf-8", "replace")
        tls = server.transport.get_extra_info("ssl_object")
        record = {
            "tls_version": tls.version() if tls is not None else None,
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "auth_login": login,
            "from": str(msg["from"]),
            "to": str(msg["to"]),
            "subject": str(msg["subject"]),
            "content_type": msg.get_content_type(),
            "body": msg.get_content().replace("\r\n", "\n"),
        }
        self.count += 1
        path = os.path.join(self.out_dir, "msg-%04d.json" % self.count)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.rename(path + ".tmp", path)
        return "250 OK"


def authenticator(user, password):
    def check(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == user.encode()
            and auth_data.password == password.encode()
        )
        # handled=False: aiosmtpd answers 535 itself on a failure (its default, True, would answer nothing).
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)

    return check


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--user")
    parser.add_argument("--password")
    parser.add_argument("--tls", choices=["starttls", "implicit"])
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    sink = Sink(args.out_dir)
    auth = {}
    if args.user is not None:
        auth = dict(
            authenticator=authenticator(args.user, args.password or ""),
            auth_required=True,
            auth_require_tls=False,
        )
    listener_tls = None
    if args.tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        if args.tls == "starttls":
            auth.update(tls_context=context, require_starttls=True)
        else:
            listener_tls = context
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(sink, **auth), "127.0.0.1", 0, ssl=listener_tls)
    print(server.sockets[0].getsockname()[1], flush=True)
    # Exit when the test closes our stdin (or dies), so no server outlives its test.
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
