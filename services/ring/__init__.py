"""PSP ring mode: a ring node (`node`), the ring head it becomes when first in the ring
(`head`), rollback to a checkpoint (`recovery`) and the node's transactional output
(`transactions`)."""
