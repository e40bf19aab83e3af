"""The batch contract: how a pack becomes a batch, one module per part (a new batch key goes here).

    main process   budgets      seq_len, pad id, M image slots; whether the dataset carries pixels
                   packed_with  the processor checked against the one the dataset was packed with
    worker/pack    buffers.staged_example ◄─ images (bytes → uint8 pixels) | model (a processor's parts)
    worker/batch   collate_fn.LoaderCollate ─► buffers.collate_staged ─► Shipment ─► main process
                       text.text_batch   input_ids, labels, position_ids, seq_idx, num_*, source_idx, image slots
                       collate.segment_batch  cu_seqlens, max_seqlen, num_targets, segment_targets, attention_mask
                       buffers / model   pixel_values (written once), patch_mask, image_grid_thw, a family's keys
    reference      collate.pack_to_example ─► collate.collate_packs: the same batch, one pack at a time

Import from the defining module (``wdspack.loader.batch.collate``); this package re-exports nothing.
"""
