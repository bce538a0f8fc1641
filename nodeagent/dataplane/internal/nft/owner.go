package nft

import (
	"bytes"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Ownership. A table's name says what it is meant to be, not who made
// it: any program on the node can create a table called proxyshift. So
// every table a Txn creates carries a mark, the comment OwnerComment in
// the table's user data (NFTA_TABLE_USERDATA, where `nft add table ip t
// { comment "…"; }` puts it, and where `nft list table` shows it), and
// FindTable, OpenTable, TableExists and DeleteTable treat a table of the
// name without the mark as someone else's: a *ForeignTableError, never
// read as ours, written or deleted. (google/nftables v0.3.0 neither
// writes nor reads table user data, so the mark is added to the batch's
// new-table messages on their way out, and read with a dump of our own.)
// The kernel sets a table's user data only when it creates the table, so
// adding an existing table, as a full sync does, does not mark it.

// OwnerComment is the comment that marks a table as proxyshift's.
const OwnerComment = "managed by proxyshift"

const (
	// nftaTableUserdata is NFTA_TABLE_USERDATA (linux/netfilter/nf_tables.h),
	// which golang.org/x/sys does not define.
	nftaTableUserdata = 6
	// udataTableComment is NFTNL_UDATA_TABLE_COMMENT, the type of the
	// comment among the user data's type-length-value records (libnftnl).
	udataTableComment = 0
)

// ForeignTableError says a table has the name of one of proxyshift's but
// not its mark: another program made it, and proxyshift leaves it alone.
type ForeignTableError struct {
	// Family is the table's family (ip, ip6); Table its name.
	Family, Table string
	// Comment is the comment the table carries, if any.
	Comment string
}

// Error names the table and says why it is not proxyshift's.
func (e *ForeignTableError) Error() string {
	has := "no comment"
	if e.Comment != "" {
		has = fmt.Sprintf("the comment %q", e.Comment)
	}
	return fmt.Sprintf("nftables table %s %s was not created by proxyshift (it has %s, not %q): left alone; remove it, or the program that made it, for proxyshift to use the name", e.Family, e.Table, has, OwnerComment)
}

// ownerUserdata is the user data that marks a table: one comment record,
// NUL-terminated as nft writes it.
var ownerUserdata = append([]byte{udataTableComment, byte(len(OwnerComment) + 1)}, OwnerComment+"\x00"...)

// newTable is the header type of a new-table message.
const newTable = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE)

// markTables adds the ownership mark to every new-table message of batch.
func markTables(batch []netlink.Message) {
	for i := range batch {
		if batch[i].Header.Type != newTable {
			continue
		}
		d := batch[i].Data
		for len(d)%4 != 0 {
			d = append(d, 0)
		}
		batch[i].Data = appendAttr(d, nftaTableUserdata, ownerUserdata)
	}
}

// tableComment returns the comment among a table's user data, "" if none.
func tableComment(udata []byte) string {
	for len(udata) >= 2 {
		typ, n := udata[0], int(udata[1])
		if 2+n > len(udata) {
			break
		}
		if typ == udataTableComment {
			return string(bytes.TrimRight(udata[2:2+n], "\x00"))
		}
		udata = udata[2+n:]
	}
	return ""
}

// FindTable returns table name of family f in network namespace netns, nil
// if there is none, and a *ForeignTableError if the table there does not
// carry proxyshift's mark.
func FindTable(netns nsexec.NS, f *Family, name string) (*nftables.Table, error) {
	found, err := CheckOwned(netns, f.Table, f.Name, name)
	if err != nil || !found {
		return nil, err
	}
	return &nftables.Table{Name: name, Family: f.Table}, nil
}

// FindTables says which of the tables names of family f exist in network
// namespace netns with proxyshift's mark, from one listing of the
// family's tables, and returns a *ForeignTableError for the first of
// them (in the order of names) that exists without it.
func FindTables(netns nsexec.NS, f *Family, names []string) (map[string]bool, error) {
	return findTables(netns, f.Table, f.Name, names)
}

// CheckOwned says whether table name of family fam (famName in messages:
// ip, ip6, inet) exists in network namespace netns, and returns a
// *ForeignTableError if it exists without proxyshift's mark.
func CheckOwned(netns nsexec.NS, fam nftables.TableFamily, famName, name string) (bool, error) {
	found, err := findTables(netns, fam, famName, []string{name})
	return found[name] || err != nil, err
}

// findTables is FindTables for family fam, named famName in messages.
func findTables(netns nsexec.NS, fam nftables.TableFamily, famName string, names []string) (map[string]bool, error) {
	comments := map[string]string{}
	err := dumpWith(netns, fam, unix.NFT_MSG_GETTABLE, netlink.NewAttributeEncoder(), func(a *attrs) {
		var n string
		var udata []byte
		for a.next() {
			switch a.typ {
			case unix.NFTA_TABLE_NAME:
				n = a.str()
			case nftaTableUserdata:
				udata = a.val
			}
		}
		comments[n] = tableComment(udata)
	})
	if err != nil {
		return nil, fmt.Errorf("nft: list the %s tables: %w", famName, err)
	}
	found := map[string]bool{}
	var foreign error
	for _, name := range names {
		comment, ok := comments[name]
		switch {
		case !ok:
		case comment != OwnerComment:
			if foreign == nil {
				foreign = &ForeignTableError{Family: famName, Table: name, Comment: comment}
			}
		default:
			found[name] = true
		}
	}
	return found, foreign
}
