"""SplitJoin: coordination-free broadcast cores with results in input order.

* `input_order`  every core's identical merge of the source partitions into one
                 numbered sequence (no coordinator on the data path)
* `schedule`     which core stores a tuple: per-stream sequence number mod k,
                 with k switched at sequence numbers
* `core`         one join core: stores its share, probes every tuple against its
                 sub-window, expires, punctuates
* `merge`        the merger's ordering: results released in input order once
                 every core that may still produce them has punctuated past them
"""
