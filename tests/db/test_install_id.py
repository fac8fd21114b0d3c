"""Issue 23 (trust7): two tco installs sharing one Grid Engine cell and submit account.

The attack (on a clean install): both installs number their campaigns from 1 and named a campaign's
job ``tco-c<id>-<name>``, so install B's reconciler, looking for the job of its campaign 1 whose
submitter died (by name and owner, in qstat, the polls' tasks and the accounting records, which
all list the whole cell), found install A's campaign 1's job and adopted it: B then showed,
controlled and billed A's job as its own, and never submitted its own. The job name now carries
the install's id (``tco-<install>-c<id>-<name>``, dashboards/core/install.py).

Both installs are played on one database and one scheduler fake: the install id is switched with
``TCO_INSTALL_ID``, which is all that tells two installs' campaigns of one id apart (same id, same
name, same submit account).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from dashboards.core import install
from dashboards.launch import submit
from dashboards.models import Campaign, CampaignStatus, Install, Task
from schedulers.fake import FakeScheduler
from tco_web.settings import install_id_setting
from tests.support.accounting import finished_job_records

pytestmark = pytest.mark.django_db

A, B = "insta", "instb"


@pytest.fixture(autouse=True)
def submit_account(settings):
    settings.TCO_SUBMIT_USER = "tco"


def test_install_b_never_finds_install_a_job_of_the_same_campaign_id(claimed, settings):
    """A's job of campaign <id> "victim" is in qstat, in the tasks B's polls recorded and in the
    accounting records B read (the cell's, all of them): B finds none of them, adopts nothing, and
    submits its own job; B's own job is still found in each of the three places."""
    cell = FakeScheduler(owner="tco", first_job_number=900)
    settings.TCO_INSTALL_ID = A
    a_name = submit.campaign_job_name(claimed)
    assert a_name == f"tco-insta-c{claimed.pk}-victim"
    cell.submit_array(dataclasses.replace(submit.campaign_job_spec(claimed), hold=True))  # A's job 900
    for n in (1, 2):  # what B's poll recorded of A's job 880, which already left qstat
        Task.objects.create(cluster=claimed.cluster, job_number=880, task_number=n, is_array=True, name=a_name,
                            owner="tco", state="done", active=False, submitted_at=timezone.now())
    finished_job_records(claimed, job_number=890, name=a_name, owner="tco")

    settings.TCO_INSTALL_ID = B
    b_name = submit.campaign_job_name(claimed)
    assert b_name == f"tco-instb-c{claimed.pk}-victim"
    assert submit.find_campaign_job(claimed, cell) is None
    empty = FakeScheduler(owner="tco")
    assert submit.find_campaign_job(claimed, empty) is None  # not in the polls' tasks nor in accounting
    out = submit.reconcile_submissions(scheduler=cell, grace_s=0)
    assert out["adopted"] == [] and out["released"] == [claimed.pk]
    assert Campaign.objects.get(pk=claimed.pk).job_number is None
    resubmitted = submit.campaign_submit(campaign_id=claimed.pk, scheduler=cell)
    assert resubmitted.job_number == 901 and resubmitted.status == CampaignStatus.SUBMITTED  # B's own, new
    assert [s.name for _, s in cell.submissions] == [a_name, b_name]
    assert set(Task.objects.filter(campaign=claimed).values_list("job_number", "name")) == {(901, b_name)}

    # B's own job is found by B, in qstat, then in the polls' tasks, then in accounting; A still finds A's.
    assert submit.find_campaign_job(claimed, cell) == (901, [1, 2])
    Task.objects.filter(campaign=claimed).delete()
    Task.objects.create(cluster=claimed.cluster, job_number=955, task_number=1, is_array=True, name=b_name,
                        owner="tco", state="done", active=False, submitted_at=timezone.now())
    assert submit.find_campaign_job(claimed, empty) == (955, [1, 2])
    Task.objects.filter(job_number=955).delete()
    finished_job_records(claimed, job_number=960, name=b_name, owner="tco")
    assert submit.find_campaign_job(claimed, empty) == (960, [1, 2])
    settings.TCO_INSTALL_ID = A
    assert submit.find_campaign_job(claimed, cell) == (900, [1, 2])


def test_without_the_setting_the_id_is_the_databases_and_stays(claimed, settings):
    """One id per database: every process reading it gets the row's, until the row is gone; a
    missing row is made once (8 of a-z 0-9) and kept."""
    settings.TCO_INSTALL_ID = ""
    # Made by migration 0025; a transactional test that ran before on this database (same worker,
    # or a kept check database) flushed it, and then the first read makes it.
    row = install.install_row()
    assert Install.objects.get(pk=1).install_id == row.install_id
    assert re.fullmatch(r"[a-z0-9]{8}", row.install_id)
    assert install.install_id() == row.install_id == install.install_id()
    assert submit.campaign_job_name(claimed) == f"tco-{row.install_id}-c{claimed.pk}-victim"
    Install.objects.all().delete()
    made = install.install_id()
    assert re.fullmatch(r"[a-z0-9]{8}", made) and Install.objects.get(pk=1).install_id == made
    assert install.install_id() == made and Install.objects.count() == 1
    settings.TCO_INSTALL_ID = "site7"
    assert install.install_id() == "site7" and Install.objects.get(pk=1).install_id == made


def test_a_long_campaign_name_is_cut_and_the_prefix_kept(claimed, settings):
    settings.TCO_INSTALL_ID = "abcdefghijkl"
    Campaign.objects.filter(pk=claimed.pk).update(name="x" * 100)
    name = submit.campaign_job_name(Campaign.objects.get(pk=claimed.pk))
    prefix = f"tco-abcdefghijkl-c{claimed.pk}-"
    assert name == (prefix + "x" * 100)[:64] and len(name) == 64


@pytest.mark.parametrize("bad", ["ab", "x" * 13, "Site7", "site-7", "site_7", "c12", "c1234567", "a b"])
def test_a_malformed_install_id_stops_start_up(bad):
    with pytest.raises(ImproperlyConfigured, match="TCO_INSTALL_ID"):
        install_id_setting(bad)


def test_good_install_ids_pass_and_made_ids_never_look_like_an_old_name():
    assert install_id_setting("") == "" and install_id_setting("site7") == "site7"
    assert install_id_setting("cab") == "cab" and install_id_setting("c12x") == "c12x"
    made = {install.new_install_id() for _ in range(200)}
    assert all(re.fullmatch(r"[a-z0-9]{8}", m) and not re.fullmatch(r"c[0-9]+", m) for m in made)
    assert len(made) == 200


def test_an_old_named_job_is_never_adopted_nor_resubmitted_over(claimed, settings):
    """Old names (``tco-c<id>-<name>``) were every install's: a job under one is never adopted. For a
    campaign launched before this install had an id, it may be its own job (a submitter that died
    across the upgrade): the campaign is rejected with a message naming the job, not submitted
    again. A campaign launched after the id existed never had an old name: such a job is ignored."""
    settings.TCO_INSTALL_ID = B
    old = f"tco-c{claimed.pk}-victim"
    cell = FakeScheduler(owner="tco", first_job_number=700)
    cell.submit_array(dataclasses.replace(submit.campaign_job_spec(claimed), name=old))  # job 700

    # Launched after the id existed: not its job, released and submitted afresh. (The row is made
    # first if a flush of an earlier transactional test removed migration 0025's.)
    install.install_row()
    Install.objects.filter(pk=1).update(created_at=claimed.launched_at - dt.timedelta(seconds=1))
    assert submit.find_campaign_job(claimed, cell) is None

    # Launched before: rejected, by the reconciler and by a retried submission alike.
    Install.objects.filter(pk=1).update(created_at=claimed.launched_at + dt.timedelta(seconds=1))
    with pytest.raises(submit.AmbiguousLegacyJob) as caught:
        submit.find_campaign_job(claimed, cell)
    assert caught.value.job_numbers == [700] and caught.value.name == old
    out = submit.reconcile_submissions(scheduler=cell, grace_s=0)
    assert out["rejected"] == [claimed.pk] and out["adopted"] == [] and out["released"] == []
    rejected = Campaign.objects.get(pk=claimed.pk)
    assert rejected.status == CampaignStatus.REJECTED and rejected.job_number is None
    assert f"job 700 named {old}" in rejected.submit_error and not Task.objects.filter(campaign=claimed).exists()
    assert len(cell.submissions) == 1

    Campaign.objects.filter(pk=claimed.pk).update(status=CampaignStatus.SUBMITTING, submit_claimed_at=None,
                                                  submit_claimed_by="", submit_attempts=1, submit_error="")
    again = submit.campaign_submit(campaign_id=claimed.pk, scheduler=cell)
    assert again.status == CampaignStatus.REJECTED and "job 700" in again.submit_error
    assert len(cell.submissions) == 1 and again.job_number is None

    # Its job under the new name, when there is one, is adopted as before.
    Campaign.objects.filter(pk=claimed.pk).update(status=CampaignStatus.SUBMITTING, submit_claimed_at=None,
                                                  submit_claimed_by="", submit_attempts=1, submit_error="")
    cell.submit_array(submit.campaign_job_spec(claimed))  # job 701, tco-instb-c<id>-victim
    adopted = submit.campaign_submit(campaign_id=claimed.pk, scheduler=cell)
    assert adopted.job_number == 701 and len(cell.submissions) == 2


def test_an_admin_reads_the_install_id_on_the_queue_page_and_others_do_not(as_user, settings):
    # The reviewer could not tell which jobs on a shared cluster were this install's: the id was shown nowhere.
    settings.TCO_INSTALL_ID = "siteq7"
    admin = as_user("admin").get("/").content.decode()
    assert re.search(r'id="install-id".*<code>siteq7</code>.*<code>tco-siteq7-c&lt;campaign&gt;-&lt;name&gt;</code>',
                     admin, re.S), admin[admin.find("cluster-card"):][:800]
    for role in ("viewer", "lead", "launcher"):
        page = as_user(role).get("/").content.decode()
        assert 'id="install-id"' not in page and "siteq7" not in page
