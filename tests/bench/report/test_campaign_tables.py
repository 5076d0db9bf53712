"""The campaign matrix while a campaign runs: cells with no result and no error yet are shown, not a traceback
(the dashboard's Campaigns page draws this every few seconds)."""

from bench.report import Matrix, campaign_html, campaign_sections


def test_a_running_campaign_with_pending_and_failed_cells_renders():
    m = Matrix("c1", "study", "running", cells=[
        {"cell": "glm/chat", "status": "running", "error": ""},
        {"cell": "glm/long", "status": "pending", "error": None},
        {"cell": "kimi/chat", "status": "failed", "error": "launch failed\nCUDA out of memory"},
    ])
    (_, _, cells), (_, _, gains) = campaign_sections(m)
    assert [r[0] for r in cells] == ["glm/chat", "glm/long", "kimi/chat"]
    assert cells[0][-1] == "" and cells[1][-1] == "" and cells[2][-1] == "launch failed"
    assert cells[0][2] == "-" and gains == []
    assert "glm/long" in campaign_html(m)
