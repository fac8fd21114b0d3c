"""LDAP logins against a real OpenLDAP server (Debian's slapd) started here on loopback.

slapd runs unprivileged with its own slapd.conf (-f) and database directory
under the test's temporary directory: nothing of the system's slapd
configuration is used. The directory: people alice, bob, carol, dave and an
LDAP "admin"; groups mapped to teams by TCO_LDAP_GROUP_MAP; a required group
(tco-users), a deny group (tco-locked) and an admin group (tco-admins).
Settings come from TCO_LDAP_* through tco_web/ldap_settings.py, as at a site.
"""
from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import time

import pytest
from django.test import Client

from tests.support.stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SUFFIX = "dc=tco,dc=test"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PW = "root-secret-1"
SERVICE_DN = f"cn=tco,ou=services,{SUFFIX}"
SERVICE_PW = "service-secret-1"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-1", "carol": "carol-pw-1", "dave": "dave-pw-1",
             "admin": "ldap-admin-pw-1"}
GROUP_MEMBERS = {
    "research-leads": ["alice"],
    "research-launchers": ["alice", "bob"],
    "eng-viewers": ["carol"],
    "tco-admins": ["dave"],
    "tco-users": ["alice", "bob", "carol", "dave", "admin"],
    "tco-locked": [],
}


def user_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


def group_dn(cn: str) -> str:
    return f"cn={cn},{GROUPS}"


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    """slapd on 127.0.0.1:<free port> with the directory above; yields its URI."""
    import ldap
    import ldap.modlist

    binary = shutil.which("slapd") or "/usr/sbin/slapd"
    if not os.path.exists(binary):
        pytest.fail("slapd is not installed: run scripts/setup (it installs Debian's slapd and ldap-utils)")
    tmp = tmp_path_factory.mktemp("slapd")
    (tmp / "db").mkdir()
    conf = tmp / "slapd.conf"
    conf.write_text(f"""
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
pidfile {tmp}/slapd.pid
argsfile {tmp}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 10485760
suffix "{SUFFIX}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PW}
directory {tmp}/db
access to attrs=userPassword by self read by anonymous auth by * none
access to * by users read by * none
""")
    port = free_port()
    uri = f"ldap://127.0.0.1:{port}"
    log = open(tmp / "slapd.log", "wb")
    proc = subprocess.Popen([binary, "-f", str(conf), "-h", f"{uri}/", "-d", "256"], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"slapd did not start; see {tmp / 'slapd.log'}")
                time.sleep(0.2)
        con = ldap.initialize(uri)
        con.simple_bind_s(ROOT_DN, ROOT_PW)
        entries = [
            (SUFFIX, {"objectClass": [b"dcObject", b"organization"], "dc": [b"tco"], "o": [b"tco test"]}),
            (f"ou=people,{SUFFIX}", {"objectClass": [b"organizationalUnit"], "ou": [b"people"]}),
            (f"ou=groups,{SUFFIX}", {"objectClass": [b"organizationalUnit"], "ou": [b"groups"]}),
            (f"ou=services,{SUFFIX}", {"objectClass": [b"organizationalUnit"], "ou": [b"services"]}),
            (SERVICE_DN, {"objectClass": [b"organizationalRole", b"simpleSecurityObject"], "cn": [b"tco"],
                          "userPassword": [SERVICE_PW.encode()]}),
        ]
        for uid, password in PASSWORDS.items():
            entries.append((user_dn(uid), {
                "objectClass": [b"inetOrgPerson"], "uid": [uid.encode()], "cn": [uid.title().encode()],
                "sn": [f"{uid.title()}son".encode()], "givenName": [uid.title().encode()],
                "mail": [f"{uid}@tco.test".encode()], "userPassword": [password.encode()]}))
        for cn, members in GROUP_MEMBERS.items():
            # groupOfNames needs a member: the service account keeps every group non-empty.
            dns = [user_dn(m).encode() for m in members] + [SERVICE_DN.encode()]
            entries.append((group_dn(cn), {"objectClass": [b"groupOfNames"], "cn": [cn.encode()], "member": dns}))
        for dn, attrs in entries:
            con.add_s(dn, ldap.modlist.addModlist(attrs))
        con.unbind_s()
        yield uri
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


@pytest.fixture
def directory(slapd):
    """A root connection to the directory, to lock, move and remove people during a test."""
    import ldap

    con = ldap.initialize(slapd)
    con.simple_bind_s(ROOT_DN, ROOT_PW)
    changed: list[tuple] = []

    class Directory:
        def add_member(self, cn: str, uid: str) -> None:
            con.modify_s(group_dn(cn), [(ldap.MOD_ADD, "member", [user_dn(uid).encode()])])
            changed.append(("del", cn, uid))

        def remove_member(self, cn: str, uid: str) -> None:
            con.modify_s(group_dn(cn), [(ldap.MOD_DELETE, "member", [user_dn(uid).encode()])])
            changed.append(("add", cn, uid))

        def delete_user(self, uid: str) -> None:
            con.delete_s(user_dn(uid))
            changed.append(("restore", uid, None))

    yield Directory()
    import ldap.modlist

    for action, a, b in reversed(changed):  # the next test starts from the same directory
        if action == "del":
            con.modify_s(group_dn(a), [(ldap.MOD_DELETE, "member", [user_dn(b).encode()])])
        elif action == "add":
            con.modify_s(group_dn(a), [(ldap.MOD_ADD, "member", [user_dn(b).encode()])])
        else:
            con.add_s(user_dn(a), ldap.modlist.addModlist({
                "objectClass": [b"inetOrgPerson"], "uid": [a.encode()], "cn": [a.title().encode()],
                "sn": [f"{a.title()}son".encode()], "userPassword": [PASSWORDS[a].encode()]}))
    con.unbind_s()


@pytest.fixture
def ldap_site(slapd, settings, monkeypatch, bootstrap, locmem_cache):
    """tco's settings as a site sets them: TCO_LDAP_* read by tco_web/ldap_settings.py."""
    env = {
        "TCO_LDAP_URI": slapd,
        "TCO_LDAP_BIND_DN": SERVICE_DN,
        "TCO_LDAP_BIND_PASSWORD": SERVICE_PW,
        "TCO_LDAP_USER_BASE": PEOPLE,
        "TCO_LDAP_GROUP_BASE": GROUPS,
        # research-leads before research-launchers: alice, in both, is research's lead.
        "TCO_LDAP_GROUP_MAP": (f'{{"{group_dn("research-leads")}": "research:lead", '
                               f'"{group_dn("research-launchers")}": "research:launcher", '
                               f'"{group_dn("eng-viewers").upper()}": "engineering:viewer"}}'),
        "TCO_LDAP_ADMIN_GROUP": group_dn("tco-admins"),
        "TCO_LDAP_REQUIRE_GROUP": group_dn("tco-users"),
        "TCO_LDAP_DENY_GROUP": group_dn("tco-locked"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import tco_web.ldap_settings as ldap_settings

    module = importlib.reload(ldap_settings)
    for name in module.__all__:
        setattr(settings, name, getattr(module, name))
    return settings


def login(username: str, password: str) -> Client:
    client = Client()
    resp = client.post("/login/", {"username": username, "password": password})
    client.login_status = resp.status_code  # 302: logged in; 200: the form again
    return client


def roles_of(username: str) -> dict[str, str]:
    from dashboards.models import Membership

    return {m.team.name: m.role for m in Membership.objects.filter(user__username=username).select_related("team")}


def team_groups_of(username: str) -> set[str]:
    from django.contrib.auth import get_user_model

    return {t.name for g in get_user_model().objects.get(username=username).groups.all()
            for t in [getattr(g, "team", None)] if t}


def test_groups_map_to_team_roles_at_login(ldap_site):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    for uid in ("alice", "bob", "carol", "dave"):
        assert login(uid, PASSWORDS[uid]).login_status == 302, uid
    assert roles_of("alice") == {"research": "lead"}  # the first listed group of a team wins
    assert roles_of("bob") == {"research": "launcher"}
    assert roles_of("carol") == {"engineering": "viewer"}  # group DNs compare without case
    assert roles_of("dave") == {}
    assert team_groups_of("alice") == {"research"} and team_groups_of("carol") == {"engineering"}
    dave, alice = User.objects.get(username="dave"), User.objects.get(username="alice")
    assert dave.is_staff and dave.is_superuser and not alice.is_staff
    assert (alice.first_name, alice.last_name, alice.email) == ("Alice", "Aliceson", "alice@tco.test")
    assert not alice.has_usable_password()  # nothing of the LDAP password is stored

    # What the role allows, through the pages: the lead reads research's bill page, bob may not.
    from dashboards.models import Team

    research = Team.objects.get(name="research")
    from dashboards.core.roles import user_can

    assert user_can(alice, "bill", research) and not user_can(alice, "launch", research)
    assert user_can(User.objects.get(username="bob"), "launch", research)


def test_wrong_password_and_unknown_user_are_refused(ldap_site):
    assert login("alice", "not-her-password").login_status == 200
    assert login("nobody", "whatever").login_status == 200
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="nobody").exists()


def test_roles_are_read_again_at_each_login(ldap_site, directory):
    assert login("alice", PASSWORDS["alice"]).login_status == 302
    assert roles_of("alice") == {"research": "lead"}
    directory.remove_member("research-leads", "alice")
    directory.add_member("eng-viewers", "alice")
    assert login("alice", PASSWORDS["alice"]).login_status == 302
    assert roles_of("alice") == {"research": "launcher", "engineering": "viewer"}
    directory.remove_member("research-launchers", "alice")
    directory.remove_member("eng-viewers", "alice")
    assert login("alice", PASSWORDS["alice"]).login_status == 302
    assert roles_of("alice") == {} and team_groups_of("alice") == set()


def test_locked_account_loses_access_at_its_next_request(ldap_site, directory):
    from django.contrib.auth import get_user_model

    bob = login("bob", PASSWORDS["bob"])
    assert bob.login_status == 302
    assert bob.get("/").status_code == 200
    directory.add_member("tco-locked", "bob")
    resp = bob.get("/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")
    assert bob.get("/").status_code == 302  # the session is gone, not just this answer
    assert not get_user_model().objects.get(username="bob").is_active  # API token and other sessions too
    assert login("bob", PASSWORDS["bob"]).login_status == 200  # and no new login while locked
    directory.remove_member("tco-locked", "bob")
    again = login("bob", PASSWORDS["bob"])
    assert again.login_status == 302 and again.get("/").status_code == 200
    assert get_user_model().objects.get(username="bob").is_active


def test_removed_account_loses_access_at_its_next_request(ldap_site, directory):
    carol = login("carol", PASSWORDS["carol"])
    assert carol.get("/").status_code == 200
    directory.delete_user("carol")
    resp = carol.get("/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")
    assert login("carol", PASSWORDS["carol"]).login_status == 200


def test_leaving_the_required_group_loses_access(ldap_site, directory):
    alice = login("alice", PASSWORDS["alice"])
    assert alice.get("/").status_code == 200
    directory.remove_member("tco-users", "alice")
    assert alice.get("/").status_code == 302
    assert login("alice", PASSWORDS["alice"]).login_status == 200


def test_local_admin_stays_local_and_cannot_be_taken_over(ldap_site):
    from django.contrib.auth import get_user_model

    admin_before = get_user_model().objects.get(username="admin")
    # The directory's "admin" with its directory password: refused (not a way into the local account).
    assert login("admin", PASSWORDS["admin"]).login_status == 200
    local = login("admin", os.environ["TCO_ADMIN_PASSWORD"])
    assert local.login_status == 302
    assert local.get("/").status_code == 200  # no directory check for a local session
    admin_after = get_user_model().objects.get(username="admin")
    assert admin_after.password == admin_before.password and admin_after.is_staff
    assert admin_after.email == admin_before.email  # the directory's attributes were not copied in


def test_locked_account_is_refused_at_its_next_websocket_connect(ldap_site, directory, memory_live_store):
    # memory_live_store: the socket's first snapshot is built in this process (no live producer runs here).
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from tco_web.asgi import application

    ldap_site.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    bob = login("bob", PASSWORDS["bob"])
    assert bob.login_status == 302
    cookie = f"sessionid={bob.cookies['sessionid'].value}".encode()

    async def first_answer() -> dict:
        comm = WebsocketCommunicator(application, "/ws/queue/",
                                     headers=[(b"cookie", cookie), (b"origin", b"http://testserver"),
                                              (b"host", b"testserver")])
        connected, _ = await comm.connect(timeout=10)
        assert connected
        answer = await comm.receive_output(timeout=10)
        await comm.disconnect()
        return answer

    answer = async_to_sync(first_answer)()
    assert answer["type"] == "websocket.send" and '"queue.snapshot"' in answer["text"]
    directory.add_member("tco-locked", "bob")
    answer = async_to_sync(first_answer)()
    assert answer == {"type": "websocket.close", "code": 4401}  # the consumer's "not logged in"
