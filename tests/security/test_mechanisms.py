"""The SASL mechanisms without I/O: SCRAM against RFC 7677's exchange, bad nonces,
proofs and headers; PLAIN; the PLAIN users file; the subject of a client certificate."""

from __future__ import annotations

import base64
import ssl

import pytest

from broker.sasl import (
    AuthenticationFailed,
    PlainServer,
    ScramServer,
    credential_from_salted,
    load_plain_users,
    salted_password,
)
from broker.tls import subject_dn
from tests.security.certs import CLIENT_SUBJECT, make_certificates

# RFC 7677, section 3: user "user", password "pencil".
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
NONCE = "rOprNGfwEbeRWgbNEkqO" + SERVER_NONCE
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
SERVER_FIRST = f"r={NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
CLIENT_FINAL = f"c=biws,r={NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=".encode()
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def pencil() -> object:
    salted = salted_password("SCRAM-SHA-256", "pencil", SALT, 4096)
    return credential_from_salted("SCRAM-SHA-256", salted, SALT, 4096)


def started(client_first: bytes = CLIENT_FIRST) -> ScramServer:
    server = ScramServer("SCRAM-SHA-256", server_nonce=SERVER_NONCE)
    assert server.receive_first(client_first) == "user"
    assert server.server_first(pencil()) == SERVER_FIRST  # type: ignore[arg-type]
    return server


def test_a_final_nonce_ending_with_the_combined_one_is_taken_as_kafka_takes_it():
    # librdkafka before 2.x repeats its own nonce in front; Kafka checks endsWith.
    server = started()
    doubled = CLIENT_FINAL.replace(b"r=", b"r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        server.receive_final(doubled)  # a proof over the other message fails, as it should


def test_scram_sha_256_follows_rfc_7677_exchange():
    server = started()
    assert server.principal is None
    assert server.receive_final(CLIENT_FINAL) == SERVER_FINAL
    assert server.principal == "User:user"


def test_scram_sha_512_with_a_client_of_its_own():
    """SCRAM-SHA-512 has no RFC test vector: the client side computed here, by RFC 5802."""
    import hashlib
    import hmac

    salt, iterations = b"0123456789abcdef", 4096
    salted = salted_password("SCRAM-SHA-512", "secret", salt, iterations)
    server = ScramServer("SCRAM-SHA-512")
    server.receive_first(b"n,,n=alice,r=client-nonce")
    first = server.server_first(credential_from_salted("SCRAM-SHA-512", salted, salt, iterations))
    nonce = dict(part.split("=", 1) for part in first.decode().split(","))["r"]
    assert nonce.startswith("client-nonce") and len(nonce) > len("client-nonce")
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"n=alice,r=client-nonce,{first.decode()},{without_proof}".encode()
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    stored_key = hashlib.sha512(client_key).digest()
    signature = hmac.new(stored_key, auth_message, "sha512").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    server_key = hmac.new(salted, b"Server Key", "sha512").digest()
    expected = hmac.new(server_key, auth_message, "sha512").digest()
    assert server.receive_final(final) == b"v=" + base64.b64encode(expected)
    assert server.principal == "User:alice"


@pytest.mark.parametrize(
    ("final", "why"),
    [
        (CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"), "invalid credentials"),  # wrong proof
        (CLIENT_FINAL.replace(SERVER_NONCE.encode(), b"other"), "nonce"),
        (CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), "channel binding"),  # "y,,"
        (CLIENT_FINAL.split(b",p=")[0], "no proof"),
        (CLIENT_FINAL.replace(b"c=biws,", b""), "expected c= and r="),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_a_bad_final_message_fails(final, why):
    server = started()
    with pytest.raises(AuthenticationFailed, match=why):
        server.receive_final(final)
    assert server.principal is None


@pytest.mark.parametrize(
    ("first", "why"),
    [
        (b"p=tls-unique,,n=user,r=abc", "channel binding is not supported"),
        (b"n,a=admin,n=user,r=abc", "authorization id"),
        (b"n,,n=user,r=abc,tokenauth=true", "Delegation token"),
        (b"n,,r=abc", "expected n= and r="),
        (b"n,,n=us=3Xer,r=abc", "bad escape"),
        (b"garbage", "GS2"),
    ],
)
def test_a_bad_first_message_fails(first, why):
    with pytest.raises(AuthenticationFailed, match=why):
        ScramServer("SCRAM-SHA-512").receive_first(first)


def test_an_unknown_user_fails_as_a_wrong_password_does():
    server = ScramServer("SCRAM-SHA-512")
    server.receive_first(b"n,,n=nobody,r=abc")
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        server.server_first(None)


def test_scram_user_names_are_unescaped():
    server = ScramServer("SCRAM-SHA-512")
    assert server.receive_first(b"n,a=a=2Cb=3D,n=a=2Cb=3D,r=abc") == "a,b="


def test_plain_checks_user_password_and_authorization_id():
    users = {"bob": "secret"}
    server = PlainServer(users)
    assert server.step(b"\x00bob\x00secret") == b""
    assert server.principal == "User:bob"
    assert PlainServer(users).step(b"bob\x00bob\x00secret") == b""
    for token, why in [
        (b"\x00bob\x00wrong", "Invalid username or password"),
        (b"\x00bob\x00", "password not specified"),
        (b"\x00eve\x00secret", "Invalid username or password"),
        (b"eve\x00bob\x00secret", "authorization id"),
        (b"bob\x00secret", "expected 3 tokens"),
    ]:
        with pytest.raises(AuthenticationFailed, match=why) as failed:
            PlainServer(users).step(token)
        assert "secret" not in str(failed.value)


def test_plain_users_file(tmp_path):
    path = tmp_path / "users"
    path.write_text("# team\nbob:s3:cr:et\n\n  carol : pw\n")
    assert load_plain_users(str(path)) == {"bob": "s3:cr:et", "carol": " pw"}
    path.write_text("bob:one\nnocolon-secret\n")
    with pytest.raises(ValueError, match="line 2") as failed:
        load_plain_users(str(path))
    assert "secret" not in str(failed.value)


def test_certificate_subject_as_kafka_renders_it(tmp_path):
    certs = make_certificates(tmp_path)
    der = ssl.PEM_cert_to_DER_cert(certs.client_cert.read_text())
    assert subject_dn(der) == CLIENT_SUBJECT


def test_certificate_subject_escapes_and_unknown_attributes():
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "org"),
            x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@b"),
            x509.NameAttribute(NameOID.COMMON_NAME, 'Smith, J+"x"'),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    # As Java's X500Principal.getName() writes it: escaped specials, the e-mail address
    # (no RFC 2253 keyword) as its OID and the hex of its DER IA5String.
    assert subject_dn(der) == 'CN=Smith\\, J\\+\\"x\\",1.2.840.113549.1.9.1=#1603614062,DC=org'
