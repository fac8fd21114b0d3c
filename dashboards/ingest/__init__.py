"""What the scheduler and the runners say, into database rows: the qstat poll, the accounting file,
runner records, killed runners, the cluster's status poll, campaign status. Idempotent.
"""
