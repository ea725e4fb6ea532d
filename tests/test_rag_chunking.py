"""Chunking: content-addressed ids stable across runs, size bounds, and bad documents reported by name."""
from __future__ import annotations

from agenttune_lib.corpus import Document
from agenttune_lib.rag.chunking import ChunkingConfig, chunk_documents, chunk_text, doc_id_for
from _rag_helpers import licensed_documents


def test_chunk_ids_are_stable_and_content_addressed():
    docs = licensed_documents()[:4]
    a, _ = chunk_documents(docs)
    b, _ = chunk_documents(list(reversed(docs)))
    assert {c.chunk_id for c in a} == {c.chunk_id for c in b}
    assert len({c.chunk_id for c in a}) == len(a)
    for c in a:
        assert c.doc_id == doc_id_for(next(d.text for d in docs if d.doc_id == c.doc_id))
    # editing one document changes only that document's chunk ids
    edited = [Document.create(docs[0].text + "\n\nAn appended clause.", "licensedcode", docs[0].path, docs[0].title)] + docs[1:]
    c, _ = chunk_documents(edited)
    old_other = {x.chunk_id for x in a if x.doc_id != docs[0].doc_id}
    assert old_other <= {x.chunk_id for x in c}


def test_an_edit_elsewhere_in_a_document_keeps_the_other_chunks_ids():
    paragraphs = [f"Clause {i}. " + f"The licensee shall keep record {i} for audit. " * 12 for i in range(12)]
    doc = Document.create("\n\n".join(paragraphs), "folder", "contract.txt", "Contract")
    before, _ = chunk_documents([doc])
    paragraphs[5] = paragraphs[5].replace("record 5", "ledger 5")
    after, _ = chunk_documents([Document.create("\n\n".join(paragraphs), "folder", "contract.txt", "Contract")])
    assert before[0].doc_id != after[0].doc_id  # the document's text changed
    changed = {x.chunk_id for x in before} - {x.chunk_id for x in after}
    assert len(changed) == 1 and "record 5" in next(x.text for x in before if x.chunk_id in changed)
    assert len({x.chunk_id for x in after}) == len(after)

def test_chunks_respect_bounds_and_keep_text():
    text = "\n\n".join(f"Section {i}. " + "The licensee shall not copy the software. " * (3 + i % 7) for i in range(40))
    cfg = ChunkingConfig(max_chars=500)
    pieces = chunk_text(text, cfg)
    assert all(len(p) <= 500 for p in pieces)
    assert len(pieces) > 5
    assert " ".join(" ".join(p.split()) for p in pieces).count("Section") == 40


def test_bad_documents_are_named_and_others_processed():
    good = licensed_documents()[:1][0]
    docs = [
        good,
        Document("d-empty", "folder", "docs/empty.txt", "empty", "", "   \n ", {}),
        Document("d-bin", "folder", "docs/blob.bin", "blob", "", "abc\x00\x01def", {}),
        Document("d-enc", "folder", "docs/latin.txt", "latin", "", "caf\ufffd " * 50, {}),
    ]
    chunks, skipped = chunk_documents(docs)
    assert {c.doc_id for c in chunks} == {good.doc_id}
    messages = {s.path: s.message() for s in skipped}
    assert "no text" in messages["docs/empty.txt"] and "docs/empty.txt" in messages["docs/empty.txt"]
    assert "binary" in messages["docs/blob.bin"]
    assert "encoding" in messages["docs/latin.txt"]
